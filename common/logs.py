"""Logging set-up shared by every service: the service name and index in every line."""

from __future__ import annotations

import logging
import os
import sys

from ztgi.common.log_rate_limit import RateLimitFilter

_FORMAT = "%(asctime)s %(levelname)s %(service)s %(name)s: %(message)s"


class _ServiceFilter(logging.Filter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        return True


def setup_logging(service: str, level: str | None = None, rate_limit_s: float = 10.0) -> None:
    """Configures the root logger once for a service process (`service` like `worker[0]`).

    A warning repeated more than a few times within `rate_limit_s` is counted instead of
    written (`RateLimitFilter`); 0 turns that off.
    """
    level = (level or os.environ.get("ZTGI_LOG_LEVEL", "INFO")).upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.addFilter(_ServiceFilter(service))
    if rate_limit_s > 0:
        handler.addFilter(RateLimitFilter(rate_limit_s))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("asyncio", "urllib3", "filelock", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
