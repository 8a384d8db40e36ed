"""Optional CURVE encryption and authentication for the links to the scheduler.

The scheduler is the CURVE server on every socket it binds; workers, tokenizers, gateways and
direct clients are CURVE clients that must know the scheduler's public key. A socket without it
completes no handshake, so it sends and receives nothing.

Keys live in zmq's certificate files, written by `ztgi keygen DIR NAME` (or
`python -m ztgi.common.curve DIR NAME`) from `zmq.curve_keypair()`: `NAME.key` holds the public key
(hand it to the other side), `NAME.key_secret` holds both keys (keep it private, mode 0600).

- Server: `--curve-secret-key-file` (its `.key_secret`) turns CURVE on. With
  `--curve-client-keys-dir`, only clients whose public key (`*.key`) is in that directory get in
  (a ZAP handler checks each handshake); without it, any client that knows the server's public
  key does (encryption and server authentication only).
- Client: `--curve-server-public-key-file` (the scheduler's `.key`) turns CURVE on;
  `--curve-secret-key-file` is its own keypair (unset: a fresh keypair per process, which only
  a server without a client key directory accepts).

Nothing here applies when no key file is configured: plain ZMQ, as before.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from ztgi.common.config import ConfigError

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CurveKeys:
    """This side's keypair, and for a client the server's public key (z85, 40 bytes each)."""

    public_key: bytes
    secret_key: bytes = dataclasses.field(repr=False)
    server_public_key: bytes | None = None

    @property
    def is_client(self) -> bool:
        return self.server_public_key is not None


def server_keys(secret_key_file: str | None) -> CurveKeys | None:
    """The server's keys, or None when CURVE is off."""
    if secret_key_file is None:
        return None
    public_key, secret_key = load_secret_keys(secret_key_file)
    return CurveKeys(public_key, secret_key)


def client_keys(server_public_key_file: str | None, secret_key_file: str | None) -> CurveKeys | None:
    """A client's keys, or None when CURVE is off (no server public key configured)."""
    if server_public_key_file is None:
        if secret_key_file is not None:
            raise ConfigError("--curve-secret-key-file needs --curve-server-public-key-file (the "
                              "scheduler's public key) on a client")
        return None
    server_public_key = load_public_key(server_public_key_file)
    if secret_key_file is None:
        public_key, secret_key = zmq.curve_keypair()
    else:
        public_key, secret_key = load_secret_keys(secret_key_file)
    return CurveKeys(public_key, secret_key, server_public_key)


def load_public_key(path: str) -> bytes:
    """The public key in a certificate file (`.key` or `.key_secret`)."""
    return _load(path)[0]


def load_secret_keys(path: str) -> tuple[bytes, bytes]:
    """(public, secret) from a `.key_secret` certificate file."""
    public_key, secret_key = _load(path)
    if secret_key is None:
        raise ConfigError(f"{path} holds no secret key: pass the `.key_secret` file, not the `.key` one")
    return public_key, secret_key


def _load(path: str) -> tuple[bytes, bytes | None]:
    try:
        public_key, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the CURVE key file {path!r}: {exc} "
                          f"(write one with `ztgi keygen DIR NAME`)") from None
    for key in (public_key, secret_key):
        if key is not None and len(key) != 40:
            raise ConfigError(f"{path!r} does not hold a 40-character z85 CURVE key")
    return public_key, secret_key


def apply(socket: zmq.Socket, keys: CurveKeys | None) -> None:
    """Sets a socket's CURVE options (server or client side) before it binds or connects."""
    if keys is None:
        return
    socket.curve_publickey = keys.public_key
    socket.curve_secretkey = keys.secret_key
    if keys.is_client:
        socket.curve_serverkey = keys.server_public_key
    else:
        socket.curve_server = True


def start_authenticator(context: zmq.Context, client_keys_dir: str | None) -> ThreadAuthenticator | None:
    """A ZAP handler that lets in only the clients whose public key is in `client_keys_dir`.

    None when no directory is given: then any client that knows the server's key connects.
    Stop the result with `.stop()` before the context is destroyed.
    """
    if client_keys_dir is None:
        return None
    authenticator = ThreadAuthenticator(context, log=logging.getLogger("ztgi.common.curve.zap"))
    authenticator.start()
    authenticator.configure_curve(domain="*", location=client_keys_dir)
    logger.info("CURVE: only clients with a public key in %s are let in", client_keys_dir)
    return authenticator


def check_client_keys_dir(client_keys_dir: str | None) -> None:
    """ConfigError unless the directory exists and holds at least one public key file."""
    if client_keys_dir is None:
        return
    if not os.path.isdir(client_keys_dir):
        raise ConfigError(f"--curve-client-keys-dir {client_keys_dir!r} is not a directory")
    if not any(name.endswith(".key") for name in os.listdir(client_keys_dir)):
        raise ConfigError(f"--curve-client-keys-dir {client_keys_dir!r} holds no public key (*.key) file")


def write_keypair(directory: str, name: str) -> tuple[str, str]:
    """Writes NAME.key (public) and NAME.key_secret (private, mode 0600) into `directory`."""
    os.makedirs(directory, exist_ok=True)
    public_file, secret_file = zmq.auth.create_certificates(directory, name)
    os.chmod(secret_file, 0o600)
    return public_file, secret_file


def main(argv: Sequence[str] | None = None) -> int:
    """`ztgi keygen DIR NAME`: a new CURVE keypair as certificate files."""
    parser = argparse.ArgumentParser(prog="ztgi keygen", description=write_keypair.__doc__)
    parser.add_argument("directory")
    parser.add_argument("name", help="file name stem, e.g. scheduler or worker-0")
    args = parser.parse_args(argv)
    public_file, secret_file = write_keypair(args.directory, args.name)
    sys.stdout.write(f"public key: {public_file}\nsecret key: {secret_file}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
