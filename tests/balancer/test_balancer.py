"""`ztgi balancer` in front of two real HTTP servers on real sockets: connections taken in turn, a
backend that refuses skipped, a stream passed through as it is written."""

from __future__ import annotations

import asyncio
import collections

import aiohttp
from aiohttp import web

from ztgi.common.free_ports import free_port
from ztgi.services.balancer.rotation import Address, Rotation
from ztgi.services.balancer.service import Balancer, parse_address, serve


def test_rotation_takes_each_backend_in_turn_across_updates() -> None:
    rotation = Rotation()
    assert rotation.order() == []
    a, b, c = Address("10.0.0.1", 8080), Address("10.0.0.2", 8080), Address("10.0.0.3", 8080)
    rotation.update([b, a, a])
    assert [rotation.order()[0] for _ in range(4)] == [a, b, a, b]
    rotation.update([a, b, c])
    assert rotation.order() == [c, a, b]  # the turn carries over: the fifth connection, the third backend
    assert rotation.order() == [a, b, c]


def test_parse_address() -> None:
    assert parse_address("gateway:8080") == Address("gateway", 8080)


async def start_backend(name: str) -> tuple[web.AppRunner, Address]:
    async def hello(_request: web.Request) -> web.Response:
        return web.Response(text=name)

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(5):
            await response.write(f"data: {name} {i}\n\n".encode())
            await asyncio.sleep(0.05)
        return response

    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/stream", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, Address("127.0.0.1", port)


async def scenario() -> None:
    runners, addresses = zip(*[await start_backend(name) for name in ("one", "two")])
    refusing = Address("127.0.0.1", free_port())  # nothing listens there: a replica gone
    port, stop = free_port(), asyncio.Event()
    balancer = Balancer([addresses[0], refusing, addresses[1]], resolve_interval_s=0.5, connect_timeout_s=1.0)
    server = asyncio.create_task(serve(balancer, "127.0.0.1", port, stop))
    try:
        await asyncio.sleep(0.2)
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            names = []
            for _ in range(6):
                async with session.get(url + "/") as response:
                    names.append(await response.text())
            counts = collections.Counter(names)  # the refusing one's turns go to the backend after it
            assert set(counts) == {"one", "two"} and sum(counts.values()) == 6, counts
            async with session.get(url + "/stream") as response:
                events = [line async for line in response.content if line.strip()]
            assert [e.decode().split()[-1] for e in events] == ["0", "1", "2", "3", "4"]
    finally:
        stop.set()
        await server
        for runner in runners:
            await runner.cleanup()


def test_balancer_takes_backends_in_turn_skips_a_refusing_one_and_passes_streams() -> None:
    asyncio.run(scenario())
