"""docker-compose.yml, run as local processes: the file users run is the file tested.

Docker is not available here, so each compose service's command runs with its environment as a
local process, two replicas of every scalable service, over tcp on loopback, and clients go
through the one balancer as they do to port 8080. Only what cannot hold outside Docker is
rewritten: the `scheduler` host name becomes 127.0.0.1, ports become free ports, 0.0.0.0 becomes
loopback, each ready file gets its own path, and the balancer's `gateway` name becomes each local
gateway's address (Docker's DNS resolves it to every replica). tests/e2e/test_compose_docker.py
runs the same file in Docker.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
import requests
import yaml

from ztgi.common.client.sync_client import ZtgiClient
from ztgi.common.free_ports import free_port, free_port_block
from ztgi.common.health_probe import is_healthy

ROOT = pathlib.Path(__file__).resolve().parents[2]
REPLICAS = {"scheduler": 1, "worker": 2, "tokenizer": 2, "gateway": 2, "balancer": 1}


def interpolate(value: object) -> str:
    """`${NAME:-default}` as compose reads it: the variable when set and not empty, else the default."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m[1]) or m[2], str(value))


def local_environment(env: dict, base_port: int, ready_file: pathlib.Path) -> dict[str, str]:
    out = {key: interpolate(value) for key, value in env.items()}
    if "ZTGI_READY_FILE" in out:
        out["ZTGI_READY_FILE"] = str(ready_file)
    url = out["ZTGI_SCHEDULER_URL"]
    assert url.startswith("tcp://scheduler:"), url
    out["ZTGI_SCHEDULER_URL"] = f"tcp://127.0.0.1:{base_port}"
    for key in ("ZTGI_BIND_HOST", "ZTGI_HOST"):
        if out.get(key) == "0.0.0.0":
            out[key] = "127.0.0.1"
    return out


def local_command(command: list[str]) -> list[str]:
    assert command[0] == "ztgi"
    return [sys.executable, "-m", "ztgi.cli", *command[1:]]


def local_balancer_command(command: list[str], port: int, gateway_urls: list[str]) -> list[str]:
    """The balancer's command with its port free here and `gateway:8080` as every local gateway."""
    assert command[command.index("--backend") + 1] == "gateway:8080", command
    rest = [arg for i, arg in enumerate(command) if arg != "--backend" and command[i - 1] != "--backend"]
    rest[rest.index("--port") + 1] = str(port)
    backends = [arg for url in gateway_urls for arg in ("--backend", url.removeprefix("http://"))]
    return local_command([*rest, "--host", "127.0.0.1", *backends])


@pytest.fixture(scope="module")
def compose_stack(tmp_path_factory: pytest.TempPathFactory):
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = {name: s for name, s in spec["services"].items() if not s.get("profiles")}
    assert set(services) == set(REPLICAS)
    base_port = free_port_block(5)
    processes, gateway_urls = [], []
    logs = tmp_path_factory.mktemp("compose-logs")
    balancer_url = f"http://127.0.0.1:{free_port()}"
    for name, service in services.items():  # in the file's order: the balancer comes after the gateways
        for index in range(REPLICAS[name]):
            env = local_environment(service["environment"], base_port, logs / f"{name}-{index}.ready")
            command = local_command(service["command"])
            if name == "gateway":
                env["ZTGI_PORT"] = str(free_port())
                gateway_urls.append(f"http://127.0.0.1:{env['ZTGI_PORT']}")
            if name == "balancer":
                command = local_balancer_command(service["command"], int(balancer_url.rsplit(":", 1)[1]),
                                                 gateway_urls)
            log = open(logs / f"{name}-{index}.log", "w")
            processes.append(subprocess.Popen(command, cwd=ROOT, stdout=log,
                                              stderr=subprocess.STDOUT, env={**os.environ, **env}))
    try:
        wait_healthy([*gateway_urls, balancer_url], processes)
        yield balancer_url, f"tcp://127.0.0.1:{base_port}"
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        codes = [process.wait(timeout=60) for process in processes]
        assert codes == [0] * len(processes), codes


def wait_until_all_ready(scheduler_url: str, num_workers: int, num_tokenizers: int) -> None:
    """Until every worker is warmed up and every tokenizer registered (the scheduler's stats)."""
    client = ZtgiClient(scheduler_url)
    try:
        deadline = time.monotonic() + 300
        while True:
            stats = client.stats()
            if stats.num_workers == num_workers and stats.num_tokenizers == num_tokenizers:
                return
            assert time.monotonic() < deadline, stats
            time.sleep(0.5)
    finally:
        client.close()


def wait_healthy(urls: list[str], processes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in processes), "a compose service exited while starting"
        if all(is_healthy(url) for url in urls):
            return
        time.sleep(0.5)
    raise TimeoutError("compose services not healthy in time")


@pytest.mark.slow
def test_compose_topology_serves_on_every_replica(compose_stack) -> None:
    """Two gateways, two tokenizers, two workers from docker-compose.yml behind its one balancer: all
    serve, both workers used."""
    balancer_url, scheduler_url = compose_stack
    wait_until_all_ready(scheduler_url, num_workers=2, num_tokenizers=2)  # /health needs only one worker
    body = {"inputs": "The capital of France is", "parameters": {"max_new_tokens": 8}}
    expected = requests.post(balancer_url + "/generate", json=body, timeout=120).json()["generated_text"]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda i: requests.post(balancer_url + "/generate", json=body, timeout=120),
                                  range(16)))
    assert [r.status_code for r in responses] == [200] * 16
    assert {r.json()["generated_text"] for r in responses} == {expected}
    client = ZtgiClient(scheduler_url)
    try:
        stats = client.stats()
    finally:
        client.close()
    assert stats.num_workers == 2 and stats.num_tokenizers == 2
    assert all(served > 0 for served in stats.worker_requests_served.values()), stats
