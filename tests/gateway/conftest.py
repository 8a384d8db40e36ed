"""Gateway fixtures: a scripted scheduler frontend and the real gateway as a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest
import requests

from tests.gateway.openapi import load_schemas
from tests.gateway.scripted_scheduler import ScriptedScheduler
from ztgi.common.child_process import stop_process
from ztgi.common.free_ports import free_port
from ztgi.common.health_probe import NotHealthyError, wait_until_healthy

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST_LIVENESS = ("--heartbeat-interval-ms", "100", "--heartbeat-misses", "15")


def new_run_dir() -> str:
    return tempfile.mkdtemp(prefix="ztgi-")  # ipc socket paths must stay short


class GatewayProcess:
    """`python -m ztgi.services.gateway` on a free port, for as long as a test needs it."""

    def __init__(self, scheduler_url: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "ztgi.services.gateway", "--port", str(self.port),
                   "--scheduler-url", scheduler_url, *FAST_LIVENESS, *args]
        self.log = tempfile.TemporaryFile()  # a pipe nobody reads could fill up and block it
        self.process = subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                        stdout=self.log, stderr=subprocess.STDOUT,
                                        env=None if env is None else {**os.environ, **env})
        self._wait_ready()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"gateway exited: {self.output()}"
            try:
                requests.get(self.url + "/ping", timeout=1)
                return
            except requests.ConnectionError:
                time.sleep(0.05)
        raise AssertionError("the gateway did not come up in 20 s")

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
        """Until /health is 200: the gateway's client has heard from the scheduler (slow under load)."""
        try:
            wait_until_healthy(self.url, timeout_s, self.process, interval_s=0.05)
        except NotHealthyError as exc:
            raise AssertionError(f"the gateway did not reach its scheduler ({exc}): {self.output()}") from None

    def stop(self) -> tuple[int, str]:
        """SIGTERM, then the exit code and everything it logged (idempotent)."""
        if self.log.closed:
            return self.process.returncode, self._output
        stop_process(self.process, 15)
        self._output = self.output()
        self.log.close()
        return self.process.returncode, self._output


@pytest.fixture(scope="session")
def schemas() -> dict:
    return load_schemas()


@pytest.fixture(scope="session")
def shared_run_dir() -> Iterator[str]:
    run_dir = new_run_dir()
    yield run_dir
    shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_scheduler(shared_run_dir: str) -> Iterator[ScriptedScheduler]:
    scheduler = ScriptedScheduler(f"ipc://{shared_run_dir}").start()
    yield scheduler
    scheduler.stop()


@pytest.fixture(scope="session")
def shared_gateway(shared_scheduler: ScriptedScheduler, shared_run_dir: str) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess(f"ipc://{shared_run_dir}", "--max-payload-bytes", "65536")
    gateway.wait_healthy()
    yield gateway
    returncode, output = gateway.stop()
    assert returncode == 0, output
    assert "Traceback" not in output, output  # every failure above was an answer, not a crash


@pytest.fixture
def scheduler(shared_scheduler: ScriptedScheduler) -> Iterator[ScriptedScheduler]:
    """The shared scripted scheduler, reset to its default script before each test."""
    shared_scheduler.reset()
    yield shared_scheduler
    shared_scheduler.reset()


@pytest.fixture
def gateway(shared_gateway: GatewayProcess, scheduler: ScriptedScheduler) -> GatewayProcess:
    """The shared gateway (its scheduler reset for this test)."""
    return shared_gateway
