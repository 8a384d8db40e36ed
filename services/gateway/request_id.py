"""The id of an HTTP request: the client's `x-request-id`, or one drawn here.

It is echoed in the answer's `x-request-id` header (errors and streams too), names the request
in the gateway's log lines, becomes the OpenAI answer's id (`cmpl-<id>`, as vLLM) and begins
the ids the gateway gives its requests to the scheduler (`<id>-<suffix>`: one HTTP request may
become several, and two clients may send the same id), so one id follows the request through
every service's log.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from ztgi.services.gateway.errors import HttpError
from ztgi.services.gateway.state import REQUEST_ID

HEADER = "x-request-id"
MAX_LENGTH = 128
_VALID = re.compile(rf"[\x21-\x7e]{{1,{MAX_LENGTH}}}")  # visible ASCII: safe in headers and logs

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def request_id(request: web.Request) -> str:
    """The HTTP request's id (set by `request_id_middleware`; drawn here for a route outside it)."""
    value = request.get(REQUEST_ID)
    if value is None:
        value = request[REQUEST_ID] = uuid.uuid4().hex
    return str(value)


def pipeline_request_id(request: web.Request) -> str:
    """A fresh id for one request to the scheduler on behalf of this HTTP request."""
    return f"{request_id(request)}-{secrets.token_hex(4)}"


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Reads `x-request-id` (1 to 128 visible ASCII characters, else 400) or draws one."""
    given = request.headers.get(HEADER)
    if given is not None and not _VALID.fullmatch(given):
        raise HttpError(400, f"`{HEADER}` must be 1 to {MAX_LENGTH} visible ASCII characters", "validation")
    request[REQUEST_ID] = given if given is not None else uuid.uuid4().hex
    return await handler(request)


async def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: every answer, streamed or not, carries the request's id."""
    value = request.get(REQUEST_ID)
    if value is not None:
        response.headers[HEADER] = str(value)
