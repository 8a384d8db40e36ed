"""Whether the HTTP port `ztgi launch` was given can be served, checked before anything starts.

A port another server holds would otherwise let the pipeline start, its gateway crash-loop on
"address already in use", and `/health` answer from the other server: the launcher would call
itself ready. The check binds the address as the gateway will (SO_REUSEADDR, never
SO_REUSEPORT, so a listener that shares its port is found too) and closes it at once.
"""

from __future__ import annotations

import socket


class PortTakenError(RuntimeError):
    """The host and port cannot be bound; the message says which and what to do."""


def check_port_free(host: str, port: int) -> None:
    """Raises PortTakenError when any address `host` resolves to cannot be bound on `port`."""
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PortTakenError(f"--host {host!r} does not resolve: {exc}") from None
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise PortTakenError(f"cannot serve HTTP on {host}:{port}: {exc.strerror or exc} (another server "
                                     f"holds the port?); choose a free one with --port") from None
