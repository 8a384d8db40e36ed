"""Real service processes for the fuzz and security tests: start, watch, stop, read their logs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from ztgi.common.child_process import stop_process
from ztgi.common.client.errors import ZtgiError
from ztgi.common.client.sync_client import ZtgiClient

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEARTBEAT = ("--heartbeat-interval-ms", "200")
LIMITS = ("--max-input-tokens", "32", "--max-total-tokens", "64")


class ServiceProcess:
    """`python -m ztgi.services.<service> ARGS`, its output kept in a temporary file; `prefix` runs
    it through another command that execs it (`ip netns exec NAMESPACE`)."""

    def __init__(self, service: str, *args: str, env: dict[str, str] | None = None,
                 prefix: Sequence[str] = ()) -> None:
        self.service = service
        self.log = tempfile.TemporaryFile()  # a pipe nobody reads could fill up and block it
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", f"ztgi.services.{service}", *args], cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        self._output: str | None = None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        """Everything written so far. Read at an offset: the process shares the file's position, and
        a seek while it writes would put its next line over earlier ones."""
        if self._output is not None:
            return self._output
        fd = self.log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def stop(self) -> int:
        """SIGTERM (SIGKILL after 20 s); the exit code. Idempotent."""
        if self._output is None:
            stop_process(self.process, 20)
            self._output = self.output()
            self.log.close()
        return self.process.returncode


class Pipeline:
    """A scheduler, a tokenizer and a worker on the tiny model, with fast heartbeats and small limits."""

    def __init__(self, scheduler_url: str, model_dir: str, scheduler_args: tuple[str, ...] = (),
                 peer_args: tuple[str, ...] = ()) -> None:
        self.scheduler_url = scheduler_url
        url = ("--scheduler-url", scheduler_url)
        self.processes = [
            ServiceProcess("scheduler", *url, *HEARTBEAT, "--heartbeat-misses", "10", *LIMITS,
                           "--max-batch-prefill-tokens", "256", "--drain-timeout-s", "2", *scheduler_args),
            ServiceProcess("tokenizer", *url, *HEARTBEAT, *LIMITS, "--model-id", model_dir, *peer_args),
            ServiceProcess("worker", *url, *HEARTBEAT, "--model-id", model_dir, "--device", "cpu",
                           "--dtype", "float32", "--num-threads", "1", "--memory-budget-mb", "16",
                           "--cpu-warmup-prefill-tokens", "64", *peer_args),
        ]

    def wait_healthy(self, client: ZtgiClient, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [p for p in self.processes if not p.alive]
            assert not dead, "\n".join(f"{p.service} exited:\n{p.output()}" for p in dead)
            try:
                if client.health().healthy:
                    return
            except (ZtgiError, TimeoutError):  # not bound yet
                pass
            time.sleep(0.1)
        raise AssertionError("the pipeline was not healthy in time:\n" + self.logs())

    def all_alive(self) -> bool:
        return all(p.alive for p in self.processes)

    def logs(self) -> str:
        return "\n".join(f"--- {p.service}\n{p.output()}" for p in self.processes)

    def stop(self) -> dict[str, int]:
        """Stops in the launcher's order; each service's exit code."""
        return {p.service: p.stop() for p in self.processes}
