"""Server-sent events: a `text/event-stream` response that writes one JSON object per event."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from aiohttp import web

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",  # proxies must not hold tokens back
}


@dataclasses.dataclass(frozen=True)
class NamedEvent:
    """An event sent with its name on an `event:` line before its data (the Responses API's and
    Anthropic's streams name every event)."""

    name: str
    data: Any


class _HeadersWithFirstEvent(web.StreamResponse):
    """A StreamResponse whose headers leave in one write with the first event. aiohttp's
    StreamResponse sends them at `prepare`, a write of their own that wakes the HTTP client for
    nothing on the first token's path; `web.Response` buffers its headers this way."""

    _send_headers_immediately = False


class EventStream:
    """One SSE response: `open`, then `send` JSON events (`data: {...}\\n\\n`), then `close`.

    `abort` (gateway shutdown) cancels the task that serves the stream; that task then sends
    `abort_reason` as a last error event.
    """

    def __init__(self, request: web.Request, headers: dict[str, str] | None = None) -> None:
        self.request = request
        self.response = _HeadersWithFirstEvent(headers={**SSE_HEADERS, **(headers or {})})
        self.task: asyncio.Task  # the task serving the stream, from open()
        self.abort_reason: dict[str, str] | None = None

    async def open(self) -> EventStream:
        task = asyncio.current_task()
        assert task is not None, "a stream is served by a task"
        self.task = task
        await self.response.prepare(self.request)
        return self

    async def send(self, data: Any) -> None:
        """Writes one event (a `NamedEvent` with its name); raises ConnectionResetError once the
        HTTP client has gone."""
        name = ""
        if isinstance(data, NamedEvent):
            name, data = f"event: {data.name}\n", data.data
        payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        await self.response.write(f"{name}data: {payload}\n\n".encode())

    async def close(self) -> None:
        await self.response.write_eof()

    def abort(self, error: str, error_type: str) -> asyncio.Task:
        """Cancels the serving task, which then ends the stream with this error; returns it."""
        self.abort_reason = {"error": error, "error_type": error_type}
        self.task.cancel()
        return self.task
