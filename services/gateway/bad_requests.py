"""aiohttp's log of malformed HTTP requests, one line each instead of a traceback.

aiohttp answers a request it cannot parse (a bad request line, header or URL) with 400 and
logs the parser's exception with its whole traceback, about ten lines a request. That is the
client's fault, not the server's: this filter turns such a record into one WARNING line (and
the handler's rate limit then counts a flood of them, `ztgi.common.log_rate_limit`).
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

AIOHTTP_SERVER_LOGGER = "aiohttp.server"


class BadRequestFilter(logging.Filter):
    """Folds a parser error's traceback into its record's one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            detail = " ".join(str(exc.message).split())
            args = record.args if isinstance(record.args, tuple) else (record.args,) if record.args else ()
            record.msg = f"{record.msg}: %s (%d %s)"
            record.args = (*args, type(exc).__name__, exc.code, detail[:200])
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def install() -> None:
    logging.getLogger(AIOHTTP_SERVER_LOGGER).addFilter(BadRequestFilter())
