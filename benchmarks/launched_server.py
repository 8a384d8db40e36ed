"""`ztgi launch` as a child process on a free loopback port, for a benchmark to load."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from ztgi.common.child_process import stop_process
from ztgi.common.free_ports import free_port
from ztgi.common.health_probe import NotHealthyError, wait_until_healthy

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 40


class ServerStartError(RuntimeError):
    """The server exited or did not get healthy in time; the message carries its log's tail."""


class LaunchedServer:
    """`ztgi launch --port P FLAGS` (as `python -m ztgi launch`), ready once `/health` answers 200; SIGTERM on exit.

    Other servers with the same life (another program answering `/health`) subclass it and say
    their command (`command`), name and what the child does before exec (`before_exec`)."""

    name = "ztgi launch"

    def __init__(self, flags: Sequence[str], startup_timeout_s: float = 600.0, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.flags = ["--host", "127.0.0.1", "--port", str(self.port), *self.own_flags(), *flags]
        self.startup_timeout_s = startup_timeout_s
        prefix = self.name.replace(" ", "-") + "-"
        self.log_file = tempfile.NamedTemporaryFile("w+", prefix=prefix, suffix=".log", delete=False)
        self.process: subprocess.Popen | None = None

    def own_flags(self) -> list[str]:
        return ["--no-restart"]

    def command(self) -> list[str]:
        return [sys.executable, "-m", "ztgi", "launch", *self.flags]

    def before_exec(self) -> None:
        """Runs in the child before exec (nothing for ztgi)."""

    def __enter__(self) -> LaunchedServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Starts the launcher and waits until it serves; ServerStartError otherwise."""
        logger.info("starting %s (log %s)", " ".join(self.command()), self.log_file.name)
        self.process = subprocess.Popen(self.command(), stdout=self.log_file, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=self.before_exec)
        try:
            seconds = wait_until_healthy(self.url, self.startup_timeout_s, self.process)
        except NotHealthyError as exc:
            message = f"{self.name}: {exc}:\n{self.log_tail()}"
            self.stop()
            raise ServerStartError(message) from None
        logger.info("%s serving on %s after %.1f s", self.name, self.url, seconds)

    def resident_bytes(self) -> int:
        """The resident memory of the server's whole process tree (every service, or llama-server)."""
        return 0 if self.process is None else sum(_resident_bytes(pid) for pid in _tree(self.process.pid))

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after a minute; the log file is removed."""
        if self.process is not None and stop_process(self.process, STOP_TIMEOUT_S) is None:
            logger.warning("%s ignored SIGTERM for %.0f s: killed it", self.name, STOP_TIMEOUT_S)
        self.log_file.close()
        if os.path.exists(self.log_file.name):
            os.unlink(self.log_file.name)
        return None if self.process is None else self.process.returncode

    def log_tail(self) -> str:
        self.log_file.flush()
        with open(self.log_file.name, encoding="utf-8", errors="replace") as file:
            return "".join(file.readlines()[-LOG_TAIL_LINES:])


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants, from /proc (Linux)."""
    pids, index = [pid], 0
    while index < len(pids):
        try:
            for task in os.listdir(f"/proc/{pids[index]}/task"):
                with open(f"/proc/{pids[index]}/task/{task}/children") as file:
                    pids += [int(child) for child in file.read().split()]
        except OSError:  # gone meanwhile
            pass
        index += 1
    return pids


def _resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0
