"""llama.cpp's `llama-server` as a child process on a free loopback port, for a benchmark to load.

The binary is the user's (built from llama.cpp's source, e.g. the one vendored in the
`llama-cpp-python` sdist: BENCHMARKS.md says how); nothing here downloads or builds it.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Sequence

from ztgi.bench.launched_server import LaunchedServer, ServerStartError

logger = logging.getLogger(__name__)


def server_flags(gguf: str, num_slots: int, num_threads: int, slot_context: int, cache_prompt: bool,
                 extra: Sequence[str] = ()) -> list[str]:
    """`-m GGUF -np N -cb -t T -c N*CTX`, prompt caching off unless asked for."""
    flags = ["-m", gguf, "-np", str(num_slots), "-cb", "-t", str(num_threads), "-c", str(num_slots * slot_context)]
    if not cache_prompt:
        flags.append("--no-cache-prompt")
    return flags + list(extra)


class LlamaServer(LaunchedServer):
    """`llama-server --host 127.0.0.1 --port P FLAGS`, ready once `/health` answers 200; SIGTERM on exit."""

    name = "llama-server"

    def __init__(self, binary: str, flags: Sequence[str], startup_timeout_s: float = 300.0,
                 port: int | None = None, nice: int = 0, idle_class: bool = False) -> None:
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise ServerStartError(f"--llama-server {binary!r} is not an executable file")
        self.binary = binary
        self.nice, self.idle_class = nice, idle_class
        super().__init__(flags, startup_timeout_s, port)

    def own_flags(self) -> list[str]:
        return []

    def command(self) -> list[str]:
        return [self.binary, *self.flags]

    def version(self) -> str:
        """`llama-server --version`'s first line (the commit it was built from)."""
        result = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=30)
        lines = (result.stdout + result.stderr).strip().splitlines()
        return lines[0] if lines else "unknown"

    def before_exec(self) -> None:
        """In the child before exec: the priority ztgi's CPU worker takes (`--cpu-nice`,
        `--cpu-idle-class`), so other work on the machine slows both servers alike."""
        if self.nice:
            os.nice(self.nice)
        if self.idle_class and hasattr(os, "SCHED_IDLE"):
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            except OSError:
                pass
