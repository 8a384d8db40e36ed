"""One supervised child process with its log lines prefixed by its name."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from ztgi.common.child_process import wait_or_kill

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM if the launcher dies, even by SIGKILL (no orphans)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class Child:
    """A service process: `python -m ztgi.services.<service> ARGS` with extra environment.

    Each child runs in a process group of its own: a terminal's Ctrl-C, `kill -- -PGID` or an init
    that signals the launcher's group reaches the launcher only, which then stops the children in
    order (gateways drain first, workers last); had they got the signal too, workers and tokenizers
    would stop while the scheduler still drained requests that need them.
    """

    def __init__(self, name: str, service: str, args: Sequence[str], env: dict[str, str]) -> None:
        self.name = name
        self.service = service
        self.args = list(args)
        self.env = env
        self.process: subprocess.Popen | None = None
        self.num_restarts = 0

    def start(self) -> None:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", f"ztgi.services.{self.service}", *self.args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            process_group=0,  # a signal to the launcher's group (Ctrl-C, kill -- -PGID) reaches it alone
        )
        threading.Thread(target=self._pump_logs, args=(self.process,), daemon=True).start()

    def _pump_logs(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        prefix = f"[{self.name}] ".encode()
        for line in process.stdout:
            sys.stderr.buffer.write(prefix + line)
            sys.stderr.buffer.flush()

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        if self.alive:
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> None:
        """Waits for exit; kills the process if it outlives `timeout_s`."""
        if self.process is not None and wait_or_kill(self.process, timeout_s) is None:
            logger.warning("%s did not exit in %.0f s; killed it", self.name, timeout_s)
