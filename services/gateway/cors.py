"""CORS allow-list (TGI's `--cors-allow-origin`): browsers from listed origins may call the API.

A listed origin gets `Access-Control-Allow-Origin` on every answer and its preflight `OPTIONS`
is answered here (204, with the methods and headers it asked for); any other origin gets no
CORS header, and its preflight a 403, so the browser refuses the call. Requests without an
`Origin` header (not from a browser page) are untouched.
"""

from __future__ import annotations

from aiohttp import web

from ztgi.services.gateway.errors import Handler, error_for

ALLOWED_METHODS = "GET, POST, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type"
PREFLIGHT_MAX_AGE_S = 600


class CorsPolicy:
    """Which origins may call, and the headers that tell a browser so."""

    def __init__(self, allowed_origins: tuple[str, ...]) -> None:
        self.allow_any = "*" in allowed_origins
        self.allowed_origins = frozenset(allowed_origins)

    def allows(self, origin: str) -> bool:
        return self.allow_any or origin in self.allowed_origins

    def response_headers(self, origin: str) -> dict[str, str]:
        return {"Access-Control-Allow-Origin": "*" if self.allow_any else origin, "Vary": "Origin"}

    def preflight_headers(self, origin: str, requested_headers: str | None) -> dict[str, str]:
        return {**self.response_headers(origin), "Access-Control-Allow-Methods": ALLOWED_METHODS,
                "Access-Control-Allow-Headers": requested_headers or ALLOWED_HEADERS,
                "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S)}


def is_preflight(request: web.Request) -> bool:
    return request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers


def install_cors(app: web.Application, allowed_origins: tuple[str, ...]) -> None:
    """Answers preflights in a middleware (added first: outermost) and adds the allow header to
    every answer just before its headers go out (streams included)."""
    policy = CorsPolicy(allowed_origins)

    @web.middleware
    async def cors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None or not is_preflight(request):
            return await handler(request)
        if not policy.allows(origin):
            return error_for(request, 403, f"origin {origin!r} is not allowed (--cors-allow-origin)", "cors")
        requested = request.headers.get("Access-Control-Request-Headers")
        return web.Response(status=204, headers=policy.preflight_headers(origin, requested))

    async def add_allow_header(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and policy.allows(origin) and not is_preflight(request):
            response.headers.update(policy.response_headers(origin))

    app.middlewares.insert(0, cors_middleware)
    app.on_response_prepare.append(add_allow_header)
