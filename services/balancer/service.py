"""`ztgi balancer`: one TCP address in front of every gateway replica (docker-compose.yml's port 8080).

Compose gives each replica of a service its own address and resolves the service's name to all of
them (Docker's DNS), but publishes a host port per container, not one for the service. This proxy
owns the one published port: it resolves `--backend` names every `--resolve-interval-s`, sends each
new connection to the next address in turn (a connection that cannot be opened goes to the next),
and copies bytes both ways until either side closes. It reads nothing of HTTP, so streams (SSE)
and keep-alive pass as they are; one keep-alive connection stays on one gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Sequence

from ztgi.common.logs import setup_logging
from ztgi.services.balancer.rotation import Address, Rotation

logger = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024


def parse_address(text: str) -> Address:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return Address(host, int(port))


async def resolve(names: Sequence[Address]) -> list[Address]:
    """Every address each name resolves to now (a name that does not resolve adds none, with a log line)."""
    loop = asyncio.get_running_loop()
    found: list[Address] = []
    for name in names:
        try:
            infos = await loop.getaddrinfo(name.host, name.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            logger.warning("%s:%d does not resolve: %s", name.host, name.port, exc)
            continue
        found.extend(Address(str(info[4][0]), int(info[4][1])) for info in infos)
    return found


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes from `reader` to `writer` until `reader` ends, then an end of stream to `writer`."""
    with contextlib.suppress(OSError):
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


class Balancer:
    def __init__(self, backends: Sequence[Address], resolve_interval_s: float, connect_timeout_s: float) -> None:
        self.backends = backends
        self.resolve_interval_s = resolve_interval_s
        self.connect_timeout_s = connect_timeout_s
        self.rotation = Rotation()

    async def refresh(self) -> None:
        addresses = await resolve(self.backends)
        if set(addresses) != set(self.rotation.addresses):
            logger.info("backends: %s", ", ".join(f"{a.host}:{a.port}" for a in sorted(set(addresses))) or "none")
        self.rotation.update(addresses)

    async def refresh_forever(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.resolve_interval_s)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the next backend that accepts one, or None when none does."""
        if not self.rotation.addresses:
            await self.refresh()
        for address in self.rotation.order():
            try:
                return await asyncio.wait_for(asyncio.open_connection(*address), self.connect_timeout_s)
            except (OSError, TimeoutError) as exc:
                logger.warning("backend %s:%d refused a connection, trying the next: %r", *address, exc)
        return None

    async def handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        backend = await self.connect()
        if backend is None:
            logger.warning("no backend accepted a connection: closing the client's")
        else:
            backend_reader, backend_writer = backend
            await asyncio.gather(pipe(client_reader, backend_writer), pipe(backend_reader, client_writer))
            backend_writer.close()
        client_writer.close()


async def serve(balancer: Balancer, host: str, port: int, stop: asyncio.Event) -> None:
    server = await asyncio.start_server(balancer.handle, host, port, reuse_address=True)
    refresher = asyncio.create_task(balancer.refresh_forever())
    logger.info("balancing %s:%d over %s", host, port, ", ".join(f"{b.host}:{b.port}" for b in balancer.backends))
    try:
        await stop.wait()
    finally:
        refresher.cancel()
        server.close()


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await serve(Balancer(args.backend, args.resolve_interval_s, args.connect_timeout_s), args.host, args.port, stop)


def main(argv: Sequence[str] | None = None) -> int:
    """`ztgi balancer`: one port in front of every address the --backend names resolve to, taken in turn."""
    parser = argparse.ArgumentParser(prog="ztgi balancer", description=main.__doc__)
    parser.add_argument("--host", default="0.0.0.0", help="the address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="the port to listen on")
    parser.add_argument("--backend", type=parse_address, action="append", required=True,
                        help="HOST:PORT of the gateways (a name resolving to every replica); repeatable")
    parser.add_argument("--resolve-interval-s", type=float, default=2.0,
                        help="how often the backend names are resolved again, in seconds")
    parser.add_argument("--connect-timeout-s", type=float, default=2.0,
                        help="how long a backend may take to accept a connection before the next is tried")
    args = parser.parse_args(argv)
    setup_logging("balancer")
    asyncio.run(_main(args))
    return 0
