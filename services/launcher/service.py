"""`ztgi launch`: the whole pipeline on one host, over ipc:// in a private run directory."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from ztgi.common.config import ConfigError, parse_config
from ztgi.common.lifecycle import on_stop_signals
from ztgi.common.logs import setup_logging
from ztgi.services.launcher.config import LaunchConfig
from ztgi.services.launcher.launcher import Launcher, StartupError
from ztgi.services.launcher.port_check import PortTakenError, check_port_free

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_config(LaunchConfig, argv, prog="ztgi launch")
    except ConfigError as exc:
        print(f"ztgi launch: {exc}", file=sys.stderr)
        return 2
    setup_logging("launcher", config.log_level, config.log_rate_limit_s)
    try:
        check_port_free(config.host, config.port)
    except PortTakenError as exc:
        logger.error("startup failed: %s", exc)
        print(f"ztgi launch: {exc}", file=sys.stderr)
        return 1
    launcher = Launcher(config)
    on_stop_signals(launcher.request_stop)
    launcher.start()
    code = 1
    try:
        launcher.wait_ready()
        logger.info("ready: %s (model %s)", launcher.url, config.model_id)
        print(f"ztgi is serving on {launcher.url}", flush=True)
        code = launcher.supervise()
    except StartupError as exc:
        logger.error("startup failed: %s", exc)
    finally:
        clean = launcher.shutdown()
    return code if clean else 1
