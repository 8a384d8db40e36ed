"""How a worker leaves on SIGTERM: it finishes what it runs, then exits.

A rolling restart (Kubernetes, `docker compose up` of a new image, `kill -TERM` under `ztgi
launch`) stops workers that hold running requests. Exiting at once makes the scheduler resume
every one of them on another worker from its prompt and the tokens so far: each prefill
computed again. So the first stop signal starts a drain instead: the worker's heartbeats say
how long it has left, the scheduler admits nothing more to it, hands back at once the requests
that could not finish in time when another worker can take them, and says `drained` when no
request runs on the worker. The worker exits then, or when its grace period is over, or when
the scheduler stops answering (nothing left to finish for), or at a second stop signal.

The decisions are here, without sockets; the IO thread (`service.py`) reports what it hears.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

SILENT_HEARTBEATS = 3  # heartbeats the scheduler leaves unanswered before a draining worker stops waiting


class Drain:
    """The worker's stop, graceful for `timeout_s` (0: immediate); sets `stop_requested` when it
    is time to exit. `serving` says whether the worker has warmed up (a worker that serves
    nothing yet has nothing to finish)."""

    def __init__(self, timeout_s: float, stop_requested: threading.Event,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.stop_requested = stop_requested
        self.clock = clock
        self.serving: Callable[[], bool] = lambda: False
        self.deadline: float | None = None

    @property
    def draining(self) -> bool:
        return self.deadline is not None and not self.stop_requested.is_set()

    def request(self) -> None:
        """A stop signal: the first starts the drain of a serving worker, the second stops it now."""
        if self.deadline is not None or self.timeout_s <= 0 or not self.serving():
            self.stop_requested.set()
            return
        self.deadline = self.clock() + self.timeout_s
        logger.info("draining: running requests finish within %g s, no new ones come (stop again to exit now)",
                    self.timeout_s)

    def seconds_left(self) -> float | None:
        """What the heartbeat says: the grace left while draining, else None."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - self.clock())

    def check(self, drained: bool, scheduler_connected: bool, scheduler_silent_s: float,
              heartbeat_interval_s: float) -> None:
        """Stops the worker once the drain is over, saying why: checked on every turn of the IO loop."""
        if not self.draining:
            return
        assert self.deadline is not None
        if drained:
            logger.info("drained: no request runs here any longer; exiting")
        elif not scheduler_connected:
            logger.info("draining: no scheduler is connected; exiting")
        elif scheduler_silent_s > SILENT_HEARTBEATS * heartbeat_interval_s:
            logger.info("draining: the scheduler has not answered for %.1f s; exiting", scheduler_silent_s)
        elif self.clock() >= self.deadline:
            logger.warning("draining: %g s are over with requests still running; exiting (the scheduler "
                           "resumes them on another worker)", self.timeout_s)
        else:
            return
        self.stop_requested.set()
