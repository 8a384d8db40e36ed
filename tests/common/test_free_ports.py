"""Free loopback ports: each one, and each port of a block, can be bound."""

from __future__ import annotations

import socket

from ztgi.common.free_ports import free_port, free_port_block


def test_free_port_binds() -> None:
    """The port handed out can be bound on loopback."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", free_port()))


def test_free_port_block_binds_every_port() -> None:
    """Every port of a block of five can be bound at once."""
    base = free_port_block(5)
    sockets = [socket.socket() for _ in range(5)]
    try:
        for offset, sock in enumerate(sockets):
            sock.bind(("127.0.0.1", base + offset))
    finally:
        for sock in sockets:
            sock.close()
