"""A logging filter that keeps a flood of one warning from flooding the log.

A peer that sends 8,000 malformed frames, or an HTTP client that sends 8,000 malformed request
lines, must not write 8,000 lines. For each message template (a logger name and its format
string), at most `burst` WARNING-or-worse records pass per `interval_s`; the others are counted,
and when the interval ends one line says how many were suppressed. Records below WARNING are
never held back.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

DEFAULT_BURST = 10
_SUMMARY = "_ztgi_rate_limit_summary"  # set on the summary records this filter writes itself


@dataclasses.dataclass
class _Window:
    started_at: float
    num_passed: int = 0
    num_suppressed: int = 0
    level: int = logging.WARNING


class RateLimitFilter(logging.Filter):
    """At most `burst` records per template per `interval_s`; then a count of the rest."""

    def __init__(self, interval_s: float, burst: int = DEFAULT_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.burst = burst
        self.clock = clock
        self.windows: dict[tuple[str, str], _Window] = {}
        self.lock = threading.RLock()
        self.timer: threading.Timer | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, _SUMMARY, False):
            return True
        key = (record.name, str(record.msg))
        with self.lock:
            now = self.clock()
            window = self.windows.get(key)
            if window is None or now - window.started_at >= self.interval_s:
                if window is not None and window.num_suppressed:
                    self._summarize(key, window, now)  # the timer has not fired yet
                window = self.windows[key] = _Window(now)
            if window.num_passed < self.burst:
                window.num_passed += 1
                return True
            window.num_suppressed += 1
            window.level = max(window.level, record.levelno)
            self._schedule_flush(window.started_at + self.interval_s - now)
            return False

    def flush(self) -> None:
        """Writes the count of every template whose interval has ended with records suppressed."""
        with self.lock:
            self.timer = None
            now = self.clock()
            for key, window in list(self.windows.items()):
                if now - window.started_at >= self.interval_s:
                    if window.num_suppressed:
                        self._summarize(key, window, now)
                    del self.windows[key]
            if any(w.num_suppressed for w in self.windows.values()):
                earliest = min(w.started_at for w in self.windows.values() if w.num_suppressed)
                self._schedule_flush(earliest + self.interval_s - now)

    def _summarize(self, key: tuple[str, str], window: _Window, now: float) -> None:
        name, template = key
        logging.getLogger(name).log(
            window.level, "%d more like %r suppressed in the last %.0f s", window.num_suppressed, template,
            now - window.started_at, extra={_SUMMARY: True})
        window.num_suppressed = 0

    def _schedule_flush(self, delay_s: float) -> None:
        if self.timer is not None:
            return
        self.timer = threading.Timer(max(0.0, delay_s) + 0.01, self.flush)
        self.timer.daemon = True
        self.timer.start()
