"""CURVE: key files, socket options, and who gets through (real sockets over tcp://127.0.0.1).

The end-to-end check (the whole pipeline over CURVE, a request served, strangers answered
nothing) is `tests/fuzz/test_zmq_fuzz.py::test_curve_lets_in_only_the_right_keys`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

import pytest
import zmq

from ztgi.cli import main as cli_main
from ztgi.common import curve
from ztgi.common.config import ConfigError
from ztgi.services.gateway.config import GatewayConfig
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.tokenizer.config import TokenizerConfig
from ztgi.services.worker.config import WorkerConfig

REPLY_WAIT_MS = 20000  # an answer that should come (a loaded 2-core CI box has taken over 5 s)
SILENCE_WAIT_MS = 500  # how long a refused socket is watched (loopback handshakes take ~1 ms)


@pytest.fixture
def key_dir(tmp_path) -> str:
    for name in ("server", "client", "stranger"):
        curve.write_keypair(str(tmp_path / ("clients" if name == "client" else name)), name)
    return str(tmp_path)


def server_socket(context: zmq.Context, key_dir: str) -> tuple[zmq.Socket, int]:
    """A CURVE server ROUTER on a free loopback port, and the port."""
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    curve.apply(socket, curve.server_keys(f"{key_dir}/server/server.key_secret"))
    return socket, socket.bind_to_random_port("tcp://127.0.0.1")


def client_socket(context: zmq.Context, keys: curve.CurveKeys | None, port: int) -> zmq.Socket:
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    curve.apply(socket, keys)
    socket.connect(f"tcp://127.0.0.1:{port}")
    return socket


def echoes(server: zmq.Socket, client: zmq.Socket, wait_ms: int = REPLY_WAIT_MS) -> bool:
    """Whether a frame from `client` reaches `server` and its answer comes back."""
    client.send(b"ping", zmq.NOBLOCK)
    if not server.poll(wait_ms):
        return False
    identity, frame = server.recv_multipart()
    server.send_multipart([identity, frame + b"-pong"])
    return client.poll(REPLY_WAIT_MS) and client.recv() == b"ping-pong"


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_keygen_writes_a_usable_keypair(tmp_path, capsys) -> None:
    """`ztgi keygen DIR NAME` writes NAME.key and a private NAME.key_secret whose keys belong together."""
    assert cli_main(["keygen", str(tmp_path), "scheduler"]) == 0
    public_file, secret_file = tmp_path / "scheduler.key", tmp_path / "scheduler.key_secret"
    assert str(public_file) in capsys.readouterr().out
    assert stat.S_IMODE(os.stat(secret_file).st_mode) == 0o600
    public_key, secret_key = curve.load_secret_keys(str(secret_file))
    assert curve.load_public_key(str(public_file)) == public_key == zmq.curve_public(secret_key)


def test_bad_key_files_are_config_errors(tmp_path, key_dir: str) -> None:
    """A missing file, a public file where a secret is needed, or a lone client secret: clear ConfigErrors."""
    with pytest.raises(ConfigError, match="ztgi keygen"):
        SchedulerConfig(curve_secret_key_file=str(tmp_path / "missing.key_secret"))
    with pytest.raises(ConfigError, match="holds no secret key"):
        SchedulerConfig(curve_secret_key_file=f"{key_dir}/server/server.key")
    with pytest.raises(ConfigError, match="--curve-server-public-key-file"):
        WorkerConfig(curve_secret_key_file=f"{key_dir}/clients/client.key_secret")
    with pytest.raises(ConfigError, match="needs --curve-secret-key-file"):
        SchedulerConfig(curve_client_keys_dir=f"{key_dir}/clients")
    with pytest.raises(ConfigError, match="holds no public key"):
        SchedulerConfig(curve_secret_key_file=f"{key_dir}/server/server.key_secret",
                        curve_client_keys_dir=str(tmp_path))


def test_every_service_config_reads_curve_flags(key_dir: str) -> None:
    """Scheduler (server side) and each peer (client side) build their keys from the flags."""
    server = SchedulerConfig(curve_secret_key_file=f"{key_dir}/server/server.key_secret")
    assert server.curve_keys is not None and not server.curve_keys.is_client
    flags = dict(curve_server_public_key_file=f"{key_dir}/server/server.key",
                 curve_secret_key_file=f"{key_dir}/clients/client.key_secret")
    for config_class in (WorkerConfig, TokenizerConfig, GatewayConfig):
        keys = config_class(**flags).curve_keys
        assert keys.server_public_key == server.curve_keys.public_key, config_class
    assert all(c().curve_keys is None for c in (SchedulerConfig, WorkerConfig, TokenizerConfig, GatewayConfig))


def test_only_a_client_with_the_server_key_gets_through(context: zmq.Context, key_dir: str) -> None:
    """Without ZAP: a CURVE client that knows the server key talks; a plain socket or a wrong key gets nothing."""
    server, port = server_socket(context, key_dir)
    right = curve.client_keys(f"{key_dir}/server/server.key", None)  # a fresh client keypair
    wrong = curve.client_keys(f"{key_dir}/stranger/stranger.key", None)
    assert echoes(server, client_socket(context, right, port))
    assert not echoes(server, client_socket(context, None, port), SILENCE_WAIT_MS)
    assert not echoes(server, client_socket(context, wrong, port), SILENCE_WAIT_MS)


def test_zap_admits_only_listed_client_keys(context: zmq.Context, key_dir: str) -> None:
    """With --curve-client-keys-dir, a client whose public key is not listed gets nothing."""
    authenticator = curve.start_authenticator(context, f"{key_dir}/clients")
    try:
        server, port = server_socket(context, key_dir)
        listed = curve.client_keys(f"{key_dir}/server/server.key", f"{key_dir}/clients/client.key_secret")
        unlisted = curve.client_keys(f"{key_dir}/server/server.key", f"{key_dir}/stranger/stranger.key_secret")
        assert echoes(server, client_socket(context, listed, port))
        assert not echoes(server, client_socket(context, unlisted, port), SILENCE_WAIT_MS)
    finally:
        authenticator.stop()
