"""deploy/kubernetes's containers as local processes, probed as the kubelet probes them.

No cluster here, so each Deployment's container runs as a local process with its command and its
environment as rendered (the ConfigMaps, the CPU limit as ZTGI_NUM_THREADS, the CURVE keys where
the Secret's items put them, from `ztgi keygen`). Only what cannot hold outside a cluster is
rewritten: the scheduler Service's name becomes 127.0.0.1, ports become free ports, 0.0.0.0
becomes loopback, and each path a volume mounts becomes a folder of that pod's own, but for the
model cache: it is this machine's (`cache_root()`), shared as the example overlay shares its claim,
so the model's conversion and the C kernels are not done again for every run.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import IO

import pytest
import requests

from tests.deploy.manifests import (
    RENDERS,
    ROOT,
    Manifest,
    containers,
    environment,
    literal,
    mounted_secret_files,
    render,
    service_of,
)
from ztgi.common import curve
from ztgi.common.child_process import stop_process
from ztgi.common.free_ports import free_port, free_port_block
from ztgi.common.model_source import cache_root

START_ORDER = ("scheduler", "tokenizer", "worker", "gateway")
START_TIMEOUT_S = 400.0


class Pod:
    """One Deployment's container as a local process, and its probes run against it."""

    def __init__(self, deployment: Manifest, container: Manifest, manifests: list[Manifest],
                 root: pathlib.Path, keys: pathlib.Path, port_map: dict[int, int]) -> None:
        self.service = service_of(container)
        self.container = container
        self.port_map = port_map
        self.paths = mounted_secret_files(deployment, container, keys)
        for mount in container.get("volumeMounts", []):
            if mount["name"] == "model-cache":
                self.paths[mount["mountPath"]] = cache_root()
            elif mount["mountPath"] not in self.paths:
                (local := root / self.service / mount["name"]).mkdir(parents=True)
                self.paths[mount["mountPath"]] = str(local)
        env = {name: self.local(literal(value, container)) for name, value in environment(manifests, container).items()}
        if "ZTGI_PORT" in env:
            env["ZTGI_PORT"] = str(port_map[int(env["ZTGI_PORT"])])
        self.log: IO[str] = open(root / f"{self.service}.log", "w+")
        self.process = subprocess.Popen([sys.executable, "-m", "ztgi.cli", self.service], cwd=ROOT,
                                        stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **env})

    def local(self, value: str) -> str:
        """A value as it holds here: mounted paths, the scheduler's address, 0.0.0.0."""
        for mount_path in sorted(self.paths, key=len, reverse=True):
            if value == mount_path or value.startswith(mount_path + "/"):
                return self.paths[mount_path] + value[len(mount_path):]
        if value.startswith("tcp://ztgi-scheduler:"):
            return f"tcp://127.0.0.1:{self.port_map[int(value.rsplit(':', 1)[1])]}"
        return "127.0.0.1" if value == "0.0.0.0" else value

    def port(self, port: int | str) -> int:
        """A probe's port (a number or a container port's name) as bound here."""
        if isinstance(port, str):
            [port] = [p["containerPort"] for p in self.container["ports"] if p["name"] == port]
        return self.port_map[int(port)]

    def probe(self, kind: str) -> bool:
        """The container's `readinessProbe` or `livenessProbe`, once, as the kubelet runs it."""
        spec = self.container[kind]
        if "exec" in spec:
            command = [self.local(part) for part in spec["exec"]["command"]]
            assert command[0] == "ztgi"
            return subprocess.run([sys.executable, "-m", "ztgi.cli", *command[1:]], cwd=ROOT,
                                  capture_output=True, timeout=30).returncode == 0
        if "httpGet" in spec:
            url = f"http://127.0.0.1:{self.port(spec['httpGet']['port'])}{spec['httpGet']['path']}"
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    return 200 <= response.status < 400
            except (urllib.error.URLError, OSError):  # HTTPError (503) is a URLError
                return False
        try:
            socket.create_connection(("127.0.0.1", self.port(spec["tcpSocket"]["port"])), 2).close()
            return True
        except OSError:
            return False

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()


def start_pods(manifests: list[Manifest], root: pathlib.Path) -> dict[str, Pod]:
    keys = root / "keys"
    curve.write_keypair(str(keys), "scheduler")  # the documented commands that fill the ztgi-curve Secret
    curve.write_keypair(str(keys), "peer")
    base = free_port_block(5)
    port_map = {5550 + index: base + index for index in range(5)} | {8080: free_port()}
    by_service = {service_of(c): (d, c) for d, c in containers(manifests)}
    return {service: Pod(*by_service[service], manifests, root, keys, port_map) for service in START_ORDER}


def wait_until(condition: Callable[[], bool], pods: list[Pod], timeout_s: float) -> None:
    """Until `condition` holds, while every pod of `pods` runs (their logs when one exits or time is up)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        dead = [pod for pod in pods if pod.process.poll() is not None]
        assert not dead, "\n".join(f"--- {pod.service} exited:\n{pod.output()}" for pod in dead)
        assert time.monotonic() < deadline, "\n".join(f"--- {pod.service}\n{pod.output()}" for pod in pods)
        time.sleep(1.0)


@pytest.mark.slow
def test_the_pods_serve_and_their_probes_say_what_they_mean(tmp_path: pathlib.Path) -> None:
    """The shipped manifests' four containers, CURVE on, become ready by their own probes and serve
    a request through the gateway; when the worker stops, its probe and the gateway's readiness
    fail while the gateway's liveness holds (it is not restarted for want of a worker)."""
    pods = start_pods(render(RENDERS["shipped"]), tmp_path)
    try:
        wait_until(lambda: all(pod.probe("readinessProbe") for pod in pods.values()), list(pods.values()),
                   START_TIMEOUT_S)
        assert pods["gateway"].probe("livenessProbe") and pods["scheduler"].probe("livenessProbe")
        answer = requests.post(f"http://127.0.0.1:{pods['gateway'].port('http')}/generate", timeout=120,
                               json={"inputs": "The capital of France is", "parameters": {"max_new_tokens": 8}})
        assert answer.status_code == 200 and answer.json()["generated_text"]
        assert "CURVE: only clients with a public key in" in pods["scheduler"].output()

        assert stop_process(pods["worker"].process, 60) == 0
        assert not pods["worker"].probe("readinessProbe")
        others = [pods[service] for service in ("scheduler", "tokenizer", "gateway")]
        wait_until(lambda: not pods["gateway"].probe("readinessProbe"), others, 60)
        assert pods["gateway"].probe("livenessProbe") and pods["tokenizer"].probe("readinessProbe")
    finally:
        for pod in reversed(pods.values()):  # the launcher's order: gateways first, the scheduler last
            if pod.process.poll() is None:
                pod.process.send_signal(signal.SIGTERM)
        codes = {pod.service: stop_process(pod.process, 60) for pod in pods.values()}
        for pod in pods.values():
            pod.log.close()
    assert codes == dict.fromkeys(START_ORDER, 0), codes
