"""The gateway process: TGI's HTTP API on aiohttp + uvloop, one client of the scheduler."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence

from aiohttp import web

from ztgi.common.config import parse_config
from ztgi.common.early_stop import STOP_SIGNALS, stopped_while_starting
from ztgi.common.gc_freeze import freeze_startup_objects
from ztgi.common.logs import setup_logging
from ztgi.services.gateway import bad_requests
from ztgi.services.gateway.app import make_app
from ztgi.services.gateway.config import GatewayConfig
from ztgi.services.gateway.state import EXIT_STATUS

logger = logging.getLogger(__name__)

LINGERING_TIME_S = 10.0  # aiohttp's default


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # uvloop does not exist on Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class StopOnce:
    """The gateway's stop signals (SIGTERM, SIGINT, SIGHUP): the first ends `run_app`'s loop, which
    then drains; a later one changes nothing (aiohttp's own handler, left on during the drain,
    would end the drain itself and cut open streams without their last event)."""

    def __init__(self) -> None:
        self.stopping = False

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self, signum)
        if stopped_while_starting():  # its early exit was lost (common/early_stop.py)
            loop.call_soon(self, signal.SIGTERM)

    def __call__(self, signum: int) -> None:
        if self.stopping:
            logger.info("signal %d: already draining", signum)
            return
        logger.info("signal %d: stopping", signum)
        self.stopping = True
        raise web.GracefulExit()


def main(argv: Sequence[str] | None = None) -> int:
    """Serves until SIGTERM/SIGINT/SIGHUP, then drains for `shutdown_timeout_s` and exits 0."""
    config = parse_config(GatewayConfig, argv, prog="ztgi gateway")
    setup_logging(f"gateway[{config.gateway_index}]", config.log_level, config.log_rate_limit_s)
    bad_requests.install()
    logger.info("serving http://%s:%d for the scheduler at %s", config.host, config.port, config.scheduler_url)
    debug = logging.getLogger().isEnabledFor(logging.DEBUG)
    app = make_app(config)
    freeze_startup_objects()
    loop = new_event_loop()
    StopOnce().install(loop)
    web.run_app(
        app, host=config.host, port=config.port, reuse_port=config.reuse_port or None,
        shutdown_timeout=config.shutdown_timeout_s, handler_cancellation=True, print=None,
        # after an answer that left a body unread (413, 408), aiohttp reads and drops the rest for
        # at most this long before it closes the connection
        lingering_time=min(LINGERING_TIME_S, config.body_read_timeout_s),
        access_log=logging.getLogger("aiohttp.access") if debug else None, loop=loop,
        handle_signals=False)
    logger.info("stopped")
    return app[EXIT_STATUS].code
