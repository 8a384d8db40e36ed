"""Fuzz fixtures: one real pipeline over tcp://127.0.0.1 with CURVE on, and gateways to fuzz.

The pipeline (scheduler, tokenizer, worker on the tiny model, and a gateway) is shared by the
HTTP and ZMQ fuzz tests of a session. CURVE is on with a client key directory, so the hostile
sockets of the tests carry an authorised key: what they send reaches the decoders.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tests.fuzz.processes import LIMITS, Pipeline
from tests.gateway.conftest import GatewayProcess
from tests.gateway.scripted_scheduler import ScriptedScheduler
from ztgi.common import curve
from ztgi.common.client.sync_client import ZtgiClient
from ztgi.common.free_ports import free_port_block

FUZZ_PAYLOAD_BYTES = 65536


class Keys:
    """A server keypair, an authorised client keypair, and one the server does not know."""

    def __init__(self, directory: str) -> None:
        self.server_public, self.server_secret = curve.write_keypair(f"{directory}/server", "scheduler")
        self.clients_dir = f"{directory}/clients"
        self.client_public, self.client_secret = curve.write_keypair(self.clients_dir, "peer")
        _, self.stranger_secret = curve.write_keypair(f"{directory}/strangers", "stranger")

    @property
    def scheduler_args(self) -> tuple[str, ...]:
        return ("--curve-secret-key-file", self.server_secret, "--curve-client-keys-dir", self.clients_dir)

    @property
    def peer_args(self) -> tuple[str, ...]:
        return ("--curve-server-public-key-file", self.server_public, "--curve-secret-key-file", self.client_secret)

    def client(self) -> curve.CurveKeys:
        return curve.client_keys(self.server_public, self.client_secret)


@pytest.fixture(scope="session")
def keys() -> Iterator[Keys]:
    directory = tempfile.mkdtemp(prefix="ztgi-keys-")
    yield Keys(directory)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def pipeline(tiny_model_dir: str, keys: Keys) -> Iterator[tuple[Pipeline, ZtgiClient]]:
    """The real pipeline over tcp://127.0.0.1 with CURVE, and a direct client with the right keys."""
    pipe = Pipeline(f"tcp://127.0.0.1:{free_port_block(5)}", tiny_model_dir, keys.scheduler_args, keys.peer_args)
    client = ZtgiClient(pipe.scheduler_url, heartbeat_interval_ms=200, curve_keys=keys.client())
    try:
        pipe.wait_healthy(client)
        yield pipe, client
    finally:
        client.close()
        codes = pipe.stop()
        assert set(codes.values()) == {0}, pipe.logs()


@pytest.fixture(scope="session")
def real_gateway(pipeline: tuple[Pipeline, ZtgiClient], keys: Keys) -> Iterator[GatewayProcess]:
    """A gateway over the real pipeline."""
    gateway = GatewayProcess(pipeline[0].scheduler_url, *LIMITS, "--max-payload-bytes", str(FUZZ_PAYLOAD_BYTES),
                             *keys.peer_args)
    yield gateway
    returncode, output = gateway.stop()
    assert returncode == 0, output
    assert "Traceback" not in output, output


@pytest.fixture(scope="module")
def scripted_gateway() -> Iterator[tuple[GatewayProcess, ScriptedScheduler]]:
    """A gateway over the scripted scheduler frontend (fast: no model behind it)."""
    run_dir = tempfile.mkdtemp(prefix="ztgi-")
    scheduler = ScriptedScheduler(f"ipc://{run_dir}").start()
    # a scheduler silent for 5 s (not 0.5 s) counts as gone: the scripted one shares a loaded CPU
    gateway = GatewayProcess(f"ipc://{run_dir}", "--max-payload-bytes", str(FUZZ_PAYLOAD_BYTES),
                             "--heartbeat-misses", "50")
    try:
        yield gateway, scheduler
    finally:
        returncode, output = gateway.stop()
        scheduler.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
        assert returncode == 0, output
        assert "Traceback" not in output, output
