"""llama.cpp's `llama-server` as a child process on a free loopback port, for a benchmark to load.

The binary is the user's (built from llama.cpp's source, e.g. the one vendored in the
`llama-cpp-python` sdist: BENCHMARKS.md says how); nothing here downloads or builds it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Sequence

from benchmarks.launched_server import LOG_TAIL_LINES, STOP_TIMEOUT_S, ServerStartError, free_port

logger = logging.getLogger(__name__)


def server_flags(gguf: str, num_slots: int, num_threads: int, slot_context: int, cache_prompt: bool,
                 extra: Sequence[str] = ()) -> list[str]:
    """`-m GGUF -np N -cb -t T -c N*CTX`, prompt caching off unless asked for (ztgi has none yet)."""
    flags = ["-m", gguf, "-np", str(num_slots), "-cb", "-t", str(num_threads), "-c", str(num_slots * slot_context)]
    if not cache_prompt:
        flags.append("--no-cache-prompt")
    return flags + list(extra)


class LlamaServer:
    """`llama-server --host 127.0.0.1 --port P FLAGS`, ready once `/health` answers 200; SIGTERM on exit."""

    def __init__(self, binary: str, flags: Sequence[str], startup_timeout_s: float = 300.0,
                 port: int | None = None, nice: int = 0, idle_class: bool = False) -> None:
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise ServerStartError(f"--llama-server {binary!r} is not an executable file")
        self.binary = binary
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.flags = ["--host", "127.0.0.1", "--port", str(self.port), *flags]
        self.startup_timeout_s = startup_timeout_s
        self.nice, self.idle_class = nice, idle_class
        self.log_file = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        logger.info("starting %s %s (log %s)", self.binary, " ".join(self.flags), self.log_file.name)
        self.process = subprocess.Popen([self.binary, *self.flags], stdout=self.log_file, stderr=subprocess.STDOUT,
                                        preexec_fn=self._lower_priority)
        started = time.monotonic()
        while time.monotonic() - started < self.startup_timeout_s:
            if self.process.poll() is not None:
                message = f"llama-server exited with code {self.process.returncode}:\n{self.log_tail()}"
                self.stop()
                raise ServerStartError(message)
            if self._healthy():
                logger.info("llama-server serving on %s after %.1f s", self.url, time.monotonic() - started)
                return
            time.sleep(0.25)
        message = f"llama-server not healthy after {self.startup_timeout_s:.0f} s:\n{self.log_tail()}"
        self.stop()
        raise ServerStartError(message)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()
        if os.path.exists(self.log_file.name):
            os.unlink(self.log_file.name)

    def version(self) -> str:
        """`llama-server --version`'s first line (the commit it was built from)."""
        result = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=30)
        lines = (result.stdout + result.stderr).strip().splitlines()
        return lines[0] if lines else "unknown"

    def _lower_priority(self) -> None:
        """In the child before exec: the priority ztgi's CPU worker takes (`--cpu-nice`,
        `--cpu-idle-class`), so other work on the machine slows both servers alike."""
        if self.nice:
            os.nice(self.nice)
        if self.idle_class and hasattr(os, "SCHED_IDLE"):
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            except OSError:
                pass

    def log_tail(self) -> str:
        self.log_file.flush()
        with open(self.log_file.name, encoding="utf-8", errors="replace") as file:
            return "".join(file.readlines()[-LOG_TAIL_LINES:])

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False
