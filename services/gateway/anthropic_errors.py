"""Errors in Anthropic's shape for /v1/messages: `{"type": "error", "error": {"type", "message"}}`.

Anthropic answers a request it cannot take with 400 `invalid_request_error`, where TGI and
OpenAI's routes here answer 422; the other statuses stay TGI's, each with Anthropic's type.
"""

from __future__ import annotations

from typing import Any

ANTHROPIC_PREFIX = "/v1/messages"

_STATUS_TO_TYPE = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 408: "invalid_request_error", 413: "request_too_large",
                   415: "invalid_request_error", 429: "rate_limit_error", 503: "overloaded_error"}


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def anthropic_status(status: int) -> int:
    """Anthropic's status for one of TGI's: 400 for a refused request (TGI's 422)."""
    return 400 if status == 422 else status


def anthropic_error_json(message: str, status: int) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _STATUS_TO_TYPE.get(anthropic_status(status), "api_error"),
                                       "message": message}}
