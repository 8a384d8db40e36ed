"""How every service's `main` starts, stops and cleans up, written once.

`on_stop_signals(stop)` replaces the early hook of `common/early_stop.py` (installed by each
`__main__` before the slow imports) with the graceful one: SIGTERM, SIGINT or SIGHUP asks the
loop to drain; another during the drain asks again, which changes nothing. `serve(service)` runs
the loop and closes its sockets whatever ends it.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Protocol

from ztgi.common.early_stop import STOP_SIGNALS, stopped_while_starting
from ztgi.common.gc_freeze import freeze_startup_objects

logger = logging.getLogger(__name__)


class Service(Protocol):
    """A service's process shell: a loop that returns once it has drained, and its sockets."""

    def run(self) -> None: ...

    def close(self) -> None: ...


def on_stop_signals(stop: Callable[[], None]) -> None:
    """SIGTERM, SIGINT and SIGHUP call `stop` (logged; `stop` must be idempotent); the loop then
    drains and returns. A stop signal whose early exit was lost (`early_stop.py`) calls it now."""

    def handle(signum: int, _frame: object) -> None:
        logger.info("signal %d: stopping", signum)
        stop()

    for signum in STOP_SIGNALS:
        signal.signal(signum, handle)
    if stopped_while_starting():
        logger.info("a stop signal came while starting: stopping")
        stop()


def serve(service: Service, freeze_startup: bool = True) -> None:
    """Runs the loop, then closes the service's sockets even when the loop raised.

    `freeze_startup` first moves every object made at startup out of the garbage collector's
    reach (`common/gc_freeze.py`), so a full collection does not stall a step under load.
    """
    if freeze_startup:
        freeze_startup_objects()
    try:
        service.run()
    finally:
        service.close()
