"""The one exception a client raises for a request that failed."""

from __future__ import annotations


class ZtgiError(Exception):
    """A request failed; `error_type` is TGI's name (validation, overloaded, generation,
    unhealthy, cancelled, timeout), or for an adapter command not_found or conflict."""

    def __init__(self, message: str, error_type: str = "generation") -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type
