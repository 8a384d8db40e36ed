"""Domain errors to JSON errors with TGI's statuses.

TGI routes answer TGI's `{"error": ..., "error_type": ...}`; `/v1` routes answer OpenAI's
`{"error": {"message", "type", "param", "code"}}` (`code` carries TGI's error type), and
`/v1/messages` Anthropic's (`anthropic_errors`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from ztgi.common.client.errors import ZtgiError
from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.anthropic_errors import anthropic_error_json, anthropic_status, is_anthropic_path
from ztgi.services.gateway.state import REQUEST_ID

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

OPENAI_PREFIX = "/v1/"
_ERROR_TYPE_TO_OPENAI_TYPE = {
    "validation": "invalid_request_error",
    "payload_too_large": "invalid_request_error",
    "unsupported_media_type": "invalid_request_error",
    "request_timeout": "invalid_request_error",
    "authentication": "authentication_error",
    "overloaded": "rate_limit_error",
    "model_not_found": "invalid_request_error",
    "not_found": "invalid_request_error",
    "conflict": "invalid_request_error",
}


class HttpError(Exception):
    """A request the gateway refuses by itself, with the status to answer."""

    def __init__(self, status: int, message: str, error_type: str,
                 headers: dict[str, str] | None = None, close_connection: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.headers = headers
        self.close_connection = close_connection  # the request's body is unread: no keep-alive


def status_for(error_type: str) -> int:
    """TGI's status for an error type; failures of unknown kind are generation errors (424)."""
    return ERROR_TYPE_TO_STATUS.get(error_type, 424)


def openai_error_json(error: str, error_type: str, param: str | None = None) -> dict:
    """OpenAI's error object; the openai client raises it with `body` = the inner object."""
    kind = _ERROR_TYPE_TO_OPENAI_TYPE.get(error_type, "server_error")
    return {"error": {"message": error, "type": kind, "param": param, "code": error_type}}


def error_for(request: web.Request, status: int, error: str, error_type: str, param: str | None = None,
              headers: dict[str, str] | None = None) -> web.Response:
    """The error in the shape of the route's API: Anthropic's on /v1/messages, OpenAI's under the
    rest of /v1, TGI's elsewhere."""
    if is_anthropic_path(request.path):
        return web.json_response(anthropic_error_json(error, status), status=anthropic_status(status),
                                 headers=headers)
    if request.path.startswith(OPENAI_PREFIX):
        return web.json_response(openai_error_json(error, error_type, param), status=status, headers=headers)
    return web.json_response({"error": error, "error_type": error_type}, status=status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure of a handler becomes a JSON error; nothing escapes as an HTML page."""
    try:
        return await handler(request)
    except ValidationError as exc:
        return error_for(request, 422, str(exc), "validation", param=exc.field)
    except ZtgiError as exc:
        logger.info("%s %s [%s] failed: %s (%s)", request.method, request.path, request.get(REQUEST_ID),
                    exc.message, exc.error_type)
        return error_for(request, status_for(exc.error_type), exc.message, exc.error_type)
    except TimeoutError as exc:
        return error_for(request, 503, str(exc) or "the scheduler did not answer in time", "unhealthy")
    except HttpError as exc:
        response = error_for(request, exc.status, exc.message, exc.error_type, headers=exc.headers)
        if exc.close_connection:
            response.force_close()
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_for(request, exc.status, exc.reason, exc.reason.lower().replace(" ", "_"))
    except ConnectionError:
        raise  # the HTTP client left; there is nobody to answer
    except Exception:
        logger.exception("%s %s [%s] failed", request.method, request.path, request.get(REQUEST_ID))
        return error_for(request, 500, "internal error in the gateway", "internal")
