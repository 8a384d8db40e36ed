"""EventStream over a real aiohttp server: the headers leave with the first event, not before."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from ztgi.services.gateway.sse import EventStream

NOTHING_ARRIVES_S = 0.3


async def _first_bytes_after_open() -> tuple[bytes, bytes]:
    """What the client has read once the stream is open (nothing expected), then after one event."""
    opened, go = asyncio.Event(), asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        stream = await EventStream(request).open()
        opened.set()
        await go.wait()
        await stream.send({"token": 1})
        await stream.close()
        return stream.response

    app = web.Application()
    app.router.add_get("/events", handler)
    async with TestServer(app) as server:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(b"GET /events HTTP/1.1\r\nHost: test\r\n\r\n")
        await opened.wait()
        try:
            before = await asyncio.wait_for(reader.read(65536), NOTHING_ARRIVES_S)
        except TimeoutError:
            before = b""
        go.set()
        after = await reader.readuntil(b"data: {\"token\":1}\n\n")
        writer.close()
    return before, after


def test_headers_leave_with_the_first_event() -> None:
    """Opening the stream writes nothing; the first event brings the status line, headers and data."""
    before, after = asyncio.run(_first_bytes_after_open())
    assert before == b""
    assert after.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Type: text/event-stream" in after
    assert after.endswith(b"data: {\"token\":1}\n\n")
