"""Free TCP ports on loopback, for servers started by tests and benchmarks."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS picks it; another process may take it later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def free_port_block(num_ports: int) -> int:
    """A base port with `num_ports` consecutive free ports on loopback."""
    for _ in range(50):
        base = free_port()
        if base + num_ports >= 65536:
            continue
        try:
            for port in range(base, base + num_ports):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no block of {num_ports} free ports on loopback")
