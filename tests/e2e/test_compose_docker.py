"""docker-compose.yml run in Docker: the image built, the stack up with two workers, two tokenizers
and two gateways behind the one port, TGI and OpenAI requests through it, a worker killed under
streams (every stream finishes: its requests resume on the other worker), the stack taken down.

Marked `docker`; skipped, saying why, where no Docker daemon answers. `.ci/compose-test` prepares
one (the shared docker-here script), serves the image's wheels as an index and runs this. The build
reads `BASE_IMAGE` and `PIP_INDEX_URL` from the environment (Dockerfile); `ZTGI_TEST_NO_BUILD=1`
takes `ztgi:latest` as it is. Each compose found runs the test: `docker compose` (v2) and
`docker-compose` (v1).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from ztgi.common.free_ports import free_port
from ztgi.services.worker.kernels import native_library

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGE = "ztgi:latest"
SCALE = {"worker": 2, "tokenizer": 2, "gateway": 2}
SERVICES = {"scheduler": 1, **SCALE, "balancer": 1}
STREAMS = 8
STREAM_TOKENS = 200


def _runs(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def docker_missing() -> str | None:
    """Why no Docker daemon can be used here, or None when one answers."""
    if shutil.which("docker") is None:
        return "no docker command (install Docker, or run .ci/compose-test, which prepares a daemon)"
    if not _runs(["docker", "info"]):
        return "`docker info` fails: no Docker daemon answers (.ci/compose-test starts one)"
    return None


def compose_commands() -> list[list[str] | None]:
    found: list[list[str] | None] = []
    if shutil.which("docker") and _runs(["docker", "compose", "version"]):
        found.append(["docker", "compose"])
    if shutil.which("docker-compose") and _runs(["docker-compose", "version"]):
        found.append(["docker-compose"])
    return found


pytestmark = [pytest.mark.docker, pytest.mark.slow]
WHY_NOT = docker_missing()
COMPOSES: list[list[str] | None] = [] if WHY_NOT else compose_commands()


@dataclass
class Stack:
    compose: list[str]
    project: str
    url: str
    env: dict[str, str]

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.compose, "-p", self.project, "-f", str(ROOT / "docker-compose.yml"), *args],
                              env=self.env, cwd=ROOT, capture_output=True, text=True, check=check, timeout=timeout)

    def containers(self, service: str | None = None) -> list[str]:
        labels = [f"label=com.docker.compose.project={self.project}"]
        if service:
            labels.append(f"label=com.docker.compose.service={service}")
        out = subprocess.run(["docker", "ps", "-q", *(arg for label in labels for arg in ("--filter", label))],
                             capture_output=True, text=True, check=True).stdout
        return out.split()

    def health(self) -> dict[str, str]:
        """Each running container's name and health (healthy, starting, unhealthy)."""
        ids = self.containers()
        if not ids:
            return {}
        out = subprocess.run(["docker", "inspect", "--format", "{{.Name}} {{.State.Health.Status}}", *ids],
                             capture_output=True, text=True, check=True).stdout
        return dict(line.split() for line in out.splitlines())


@pytest.fixture(scope="module")
def image() -> str:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    if os.environ.get("ZTGI_TEST_NO_BUILD") != "1":
        args = [arg for name in ("BASE_IMAGE", "PIP_INDEX_URL") if os.environ.get(name)
                for arg in ("--build-arg", f"{name}={os.environ[name]}")]
        subprocess.run(["docker", "build", "--network", "host", *args, "-t", IMAGE, str(ROOT)],
                       check=True, capture_output=True, timeout=1800)
    return IMAGE


@pytest.fixture(params=COMPOSES or [None], ids=lambda c: " ".join(c) if c else "none")
def stack(request: pytest.FixtureRequest, image: str, tmp_path: pathlib.Path) -> Iterator[Stack]:
    if request.param is None:
        pytest.skip("neither `docker compose` (v2) nor `docker-compose` (v1) runs here")
    port = 8080 if _port_free(8080) else free_port()
    env = {**os.environ, "ZTGI_HTTP_PORT": str(port), "ZTGI_WORKER_CPUS": "1"}
    stack = Stack(request.param, f"ztgi-test-{uuid.uuid4().hex[:8]}", f"http://127.0.0.1:{port}", env)
    try:
        stack.run("up", "-d", "--no-build", *(arg for s, n in SCALE.items() for arg in ("--scale", f"{s}={n}")))
        yield stack
    finally:
        (tmp_path / "compose.log").write_text(stack.run("logs", "--no-color", check=False).stdout)
        stack.run("down", "-v", "--timeout", "20", check=False)
        print(f"compose logs: {tmp_path / 'compose.log'}")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def wait_all_healthy(stack: Stack, timeout_s: float = 420) -> float:
    """Seconds until every container says healthy and the one port answers /health."""
    start = time.monotonic()
    while True:
        health = stack.health()
        if len(health) == sum(SERVICES.values()) and set(health.values()) == {"healthy"} \
                and _answers(stack.url + "/health"):
            return time.monotonic() - start
        assert time.monotonic() - start < timeout_s, health
        time.sleep(2)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def stream(url: str, index: int, under_way: threading.Barrier) -> str:
    """A greedy streamed /generate_stream of STREAM_TOKENS through the one port, which waits at
    `under_way` once its first tokens came; its final text."""
    body: dict[str, Any] = {"inputs": f"Count from {index} to one hundred:",
                            "parameters": {"max_new_tokens": STREAM_TOKENS, "ignore_eos": True, "details": True}}
    events = []
    with requests.post(url + "/generate_stream", json=body, stream=True, timeout=300) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if line.startswith(b"data:"):
                events.append(json.loads(line[5:]))
                if len(events) == 4:
                    under_way.wait(timeout=120)
    assert events and "error" not in events[-1] and events[-1]["generated_text"] is not None, events[-1:]
    assert len(events) == events[-1]["details"]["generated_tokens"] == STREAM_TOKENS, len(events)
    return events[-1]["generated_text"]


def requeued_from_lost_workers(url: str) -> float:
    """The scheduler's `ztgi_requests_requeued{reason="worker_lost"}`, through a gateway's /metrics."""
    text = requests.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ztgi_requests_requeued_total") and 'reason="worker_lost"' in line)


def test_compose_in_docker_serves_through_one_port_and_survives_a_killed_worker(stack: Stack) -> None:
    print(f"healthy after {wait_all_healthy(stack):.0f} s")
    tgi = requests.post(stack.url + "/generate", timeout=120,
                        json={"inputs": "The capital of France is", "parameters": {"max_new_tokens": 8}})
    assert tgi.status_code == 200 and tgi.json()["generated_text"], tgi.text
    chat = requests.post(stack.url + "/v1/chat/completions", timeout=120,
                         json={"model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"], chat.text

    workers = stack.containers("worker")
    assert len(workers) == 2
    uid = subprocess.run(["docker", "exec", workers[0], "id", "-u"], capture_output=True, text=True).stdout.strip()
    assert uid == "10001"  # not root
    no_compiler = subprocess.run(["docker", "exec", workers[0], "sh", "-c", "command -v gcc cc"], capture_output=True)
    assert no_compiler.returncode != 0
    if set(native_library.PORTABLE_CPU_FLAGS) <= native_library.cpu_flags():  # the prebuilt kernels serve
        logs = subprocess.run(["docker", "logs", workers[0]], capture_output=True, text=True).stderr
        assert "C kernels" in logs and "cannot run here" not in logs, logs[-2000:]

    under_way = threading.Barrier(STREAMS + 1)  # every stream's first tokens came, on both workers
    with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        streams = [pool.submit(stream, stack.url, i, under_way) for i in range(STREAMS)]
        under_way.wait(timeout=120)
        subprocess.run(["docker", "kill", workers[1]], check=True, capture_output=True)
        texts = [s.result(timeout=300) for s in streams]
    assert all(texts)
    assert requeued_from_lost_workers(stack.url) > 0  # the killed worker's streams resumed on the other
    after = requests.post(stack.url + "/generate", timeout=120,
                          json={"inputs": "The capital of France is", "parameters": {"max_new_tokens": 8}})
    assert after.status_code == 200 and after.json()["generated_text"] == tgi.json()["generated_text"]
