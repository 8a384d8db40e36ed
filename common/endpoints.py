"""Every ZMQ address in the system, defined once.

The scheduler is the only process that binds; everyone else connects to it. One string, the
scheduler URL, locates all five endpoints:

- `ipc:///path/to/run-dir`: one socket file per endpoint inside that directory (one host).
- `tcp://host:port`: consecutive ports from `port` (compose, several hosts).

| endpoint     | scheduler side | peer side             |
|--------------|----------------|-----------------------|
| `frontend`   | ROUTER, bind   | client DEALER         |
| `tokenize`   | PUSH, bind     | tokenizer PULL        |
| `tokenized`  | PULL, bind     | tokenizer PUSH        |
| `detokenize` | ROUTER, bind   | tokenizer DEALER      |
| `workers`    | ROUTER, bind   | worker DEALER         |
"""

from __future__ import annotations

import dataclasses
import os
from urllib.parse import urlsplit

from ztgi.common.config import ConfigError

ENDPOINT_NAMES = ("frontend", "tokenize", "tokenized", "detokenize", "workers")
DEFAULT_SCHEDULER_URL = "tcp://127.0.0.1:5550"


@dataclasses.dataclass(frozen=True)
class Endpoints:
    """Connect and bind addresses for all endpoints, derived from the scheduler URL."""

    scheduler_url: str = DEFAULT_SCHEDULER_URL
    bind_host: str | None = None  # tcp only: interface the scheduler binds (default: URL host)

    def __post_init__(self) -> None:
        scheme = self.scheduler_url.split("://", 1)[0]
        if scheme not in ("ipc", "tcp") or "://" not in self.scheduler_url:
            raise ConfigError(
                f"scheduler URL {self.scheduler_url!r} must be ipc:///run/dir or tcp://host:port")
        if scheme == "tcp":
            parts = urlsplit(self.scheduler_url)
            if not parts.hostname or parts.port is None:
                raise ConfigError(f"scheduler URL {self.scheduler_url!r} needs a host and a port")

    @property
    def is_ipc(self) -> bool:
        return self.scheduler_url.startswith("ipc://")

    @property
    def run_dir(self) -> str:
        assert self.is_ipc
        return self.scheduler_url[len("ipc://"):]

    def connect(self, name: str) -> str:
        """Address a peer connects to for endpoint `name`."""
        return self._address(name, bind=False)

    def bind(self, name: str) -> str:
        """Address the scheduler binds for endpoint `name`."""
        return self._address(name, bind=True)

    def socket_files(self) -> list[str]:
        return [os.path.join(self.run_dir, f"{name}.sock") for name in ENDPOINT_NAMES] if self.is_ipc else []

    def _address(self, name: str, bind: bool) -> str:
        index = ENDPOINT_NAMES.index(name)
        if self.is_ipc:
            return f"ipc://{os.path.join(self.run_dir, name)}.sock"
        parts = urlsplit(self.scheduler_url)
        host = (self.bind_host or parts.hostname) if bind else parts.hostname
        assert host is not None and parts.port is not None, "checked in __post_init__"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"tcp://{host}:{parts.port + index}"
