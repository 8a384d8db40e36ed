"""One streamed request over HTTP, timed: the only code that waits on the server."""

from __future__ import annotations

import dataclasses
import time

import aiohttp

from ztgi.bench.http_backends import HttpBackend
from ztgi.bench.metrics import RequestRecord
from ztgi.bench.workload import Prompt

MAX_ERROR_CHARS = 500


@dataclasses.dataclass
class _Timeline:
    """perf_counter() stamps of one request: sent, each token event, final event."""

    start: float
    token_times: list[float] = dataclasses.field(default_factory=list)
    end: float | None = None
    num_reported_tokens: int | None = None
    text: str | None = None
    cached_tokens: int | None = None


async def send_request(session: aiohttp.ClientSession, url: str, backend: HttpBackend,
                       prompt: Prompt, record: RequestRecord) -> None:
    """Streams `prompt` to `url` and fills `record`; every failure becomes `record.error`."""
    timeline = _Timeline(time.perf_counter())
    try:
        async with session.post(url + backend.path, json=backend.payload(prompt)) as response:
            if response.status != 200:
                body = await response.text(errors="replace")
                record.error = f"HTTP {response.status}: {body.strip()}"
            else:
                record.error = await _read_stream(response.content, backend, timeline)
                await response.read()  # drain what follows the final event: the connection is reused
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    if record.error is not None:
        record.error = record.error[:MAX_ERROR_CHARS]
    record.set_timings(timeline.start, timeline.token_times, timeline.end or time.perf_counter(),
                       timeline.num_reported_tokens)
    record.text, record.cached_tokens = timeline.text, timeline.cached_tokens


async def _read_stream(content: aiohttp.StreamReader, backend: HttpBackend,
                       timeline: _Timeline) -> str | None:
    """Reads events up to the last one; the error text, or None when the stream ended well."""
    async for line in content:
        if not line.startswith(b"data:"):
            continue
        chunk = backend.parse(line[5:].strip())
        if chunk.has_token:
            timeline.token_times.append(time.perf_counter())
        if chunk.num_reported_tokens is not None:
            timeline.num_reported_tokens = chunk.num_reported_tokens
        if chunk.done:
            timeline.text, timeline.cached_tokens = chunk.text, chunk.cached_tokens
        if chunk.error is not None:
            return chunk.error
        if chunk.done:
            timeline.end = time.perf_counter()
            return None
    return "the stream ended before its final event"

