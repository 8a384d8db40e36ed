"""A real `ztgi launch` for end-to-end tests: every service a real process, HTTP on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import requests

from ztgi.common.child_process import stop_process
from ztgi.common.free_ports import free_port
from ztgi.common.health_probe import NotHealthyError, wait_until_healthy

SERVING_LINE = "ztgi is serving on"


class LaunchedServer:
    """`python -m ztgi.services.launcher` with flags; keeps its log; stops it with SIGTERM."""

    def __init__(self, run_dir: str, *flags: str, startup_timeout_s: float = 120.0,
                 own_process_group: bool = False) -> None:
        """`own_process_group`: the launcher leads a group of its own (as a shell's job does), so a
        test may signal the whole group."""
        self.port = free_port()
        self.run_dir = run_dir
        self.url = f"http://127.0.0.1:{self.port}"
        self.scheduler_url = f"ipc://{run_dir}"
        self.log_lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ztgi.services.launcher", "--port", str(self.port), "--run-dir", run_dir,
             "--restart", "--startup-timeout-s", str(startup_timeout_s), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, process_group=0 if own_process_group else None,
        )
        threading.Thread(target=self._collect_log, daemon=True).start()
        self._wait_ready(startup_timeout_s)

    def _collect_log(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.log_lines.append(line)

    def _wait_ready(self, timeout_s: float) -> None:
        """Healthy, and the launcher has seen it too: until it prints that it serves, a child that
        dies (a test's kill -9) fails the startup instead of being restarted."""
        try:
            wait_until_healthy(self.url, timeout_s, self.process, interval_s=0.2)
        except NotHealthyError as exc:
            self.stop()
            raise RuntimeError(f"launcher not ready ({exc}):\n{self.log}") from None
        if not self.wait_for_log(SERVING_LINE, timeout_s):
            self.stop()
            raise RuntimeError(f"launcher healthy but never said it serves:\n{self.log}")

    @property
    def log(self) -> str:
        return "".join(self.log_lines)

    def wait_for_log(self, text: str, timeout_s: float = 10.0) -> bool:
        """Whether `text` shows up in the log within `timeout_s`: the log is read by a thread, and a
        service may write a line just after the answer it concerns has left."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def post(self, path: str, body: object, **kwargs: object) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=kwargs.pop("timeout", 120), **kwargs)

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, timeout=30)

    def stop(self) -> int:
        stop_process(self.process, 60)
        return self.process.returncode
