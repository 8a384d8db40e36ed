"""Domain errors to TGI's JSON errors `{"error": ..., "error_type": ...}` with TGI's statuses."""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from aiohttp import web

from common.client import ZtgiError
from common.parameters import ValidationError

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ERROR_TYPE_TO_STATUS = {
    "validation": 422,
    "overloaded": 429,
    "generation": 424,
    "incomplete_generation": 500,
    "unhealthy": 503,
    "cancelled": 503,
    "timeout": 504,
}


class HttpError(Exception):
    """A request the gateway refuses by itself, with the status to answer."""

    def __init__(self, status: int, message: str, error_type: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type


def status_for(error_type: str) -> int:
    """TGI's status for an error type; failures of unknown kind are generation errors (424)."""
    return ERROR_TYPE_TO_STATUS.get(error_type, 424)


def error_response(status: int, error: str, error_type: str) -> web.Response:
    return web.json_response({"error": error, "error_type": error_type}, status=status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure of a handler becomes a JSON error; nothing escapes as an HTML page."""
    try:
        return await handler(request)
    except ValidationError as exc:
        return error_response(422, str(exc), "validation")
    except ZtgiError as exc:
        logger.info("%s %s failed: %s (%s)", request.method, request.path, exc.message, exc.error_type)
        return error_response(status_for(exc.error_type), exc.message, exc.error_type)
    except TimeoutError as exc:
        return error_response(503, str(exc) or "the scheduler did not answer in time", "unhealthy")
    except HttpError as exc:
        return error_response(exc.status, exc.message, exc.error_type)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason, exc.reason.lower().replace(" ", "_"))
    except ConnectionError:
        raise  # the HTTP client left; there is nobody to answer
    except Exception:
        logger.exception("%s %s failed", request.method, request.path)
        return error_response(500, "internal error in the gateway", "internal")
