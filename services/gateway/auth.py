"""The optional API key: generation routes need `Authorization: Bearer <key>` (or Anthropic's
`x-api-key: <key>`) when one is set."""

from __future__ import annotations

import hmac

from aiohttp import web

from ztgi.services.gateway.anthropic_errors import is_anthropic_path
from ztgi.services.gateway.errors import OPENAI_PREFIX, Handler, HttpError
from ztgi.services.gateway.state import CONFIG

GENERATION_PATHS = frozenset({"/", "/generate", "/generate_stream", "/invocations", "/tokenize", "/detokenize"})
"""Routes that spend model time (and every `/v1` route); health, info, docs and metrics stay open."""


def is_protected(path: str) -> bool:
    return path in GENERATION_PATHS or path.startswith(OPENAI_PREFIX)


def is_authorized(authorization: str | None, api_key: str) -> bool:
    """True when the header is `Bearer <api_key>` (compared in constant time)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), api_key.encode())


def is_api_key(x_api_key: str | None, api_key: str) -> bool:
    """True when Anthropic's `x-api-key` header is the key (compared in constant time)."""
    return x_api_key is not None and hmac.compare_digest(x_api_key.strip().encode(), api_key.encode())


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """401 (TGI's error shape, OpenAI's on /v1) for a protected route without the right key."""
    api_key = request.app[CONFIG].api_key
    if api_key is not None and is_protected(request.path) and \
            not is_authorized(request.headers.get("Authorization"), api_key) and \
            not is_api_key(request.headers.get("x-api-key"), api_key):
        how = "`x-api-key: <key>` or `Authorization: Bearer <key>`" if is_anthropic_path(request.path) \
            else "`Authorization: Bearer <key>`"
        raise HttpError(401, f"a valid API key is required: send {how}", "authentication",
                        headers={"WWW-Authenticate": "Bearer"})
    return await handler(request)
