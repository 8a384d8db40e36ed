"""Serving client streams over SSE, the same way for the TGI and the OpenAI routes.

- The first event is awaited before any header is sent, so an error that comes first (a
  validation error from the tokenizer, an overloaded scheduler) is an ordinary HTTP error.
- A later error is written as a last `data: {"error": ..., "error_type": ...}` event.
- An HTTP client that hangs up cancels its requests: aiohttp cancels the handler
  (`handler_cancellation`) or a write fails, and closing the client streams sends `Cancel`.
- Open streams are registered so that a gateway shutdown can end them with a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from ztgi.common.client.errors import ZtgiError
from ztgi.common.messages import StreamEvent
from ztgi.services.gateway.sse import EventStream
from ztgi.services.gateway.state import STREAMS

logger = logging.getLogger(__name__)

T = TypeVar("T")
Render = Callable[[T], Iterable[Any]]


async def serve_sse(request: web.Request, items: AsyncGenerator[T, None], render: Render[T],
                    trailer: Callable[[], Iterable[Any]] = lambda: (),
                    headers: dict[str, str] | None = None,
                    failure: Callable[[ZtgiError], Iterable[Any]] = lambda exc: [tgi_error_event(exc)],
                    ) -> web.StreamResponse:
    """Writes `render(item)` for every item, then `trailer()` when the items ended well, or
    `failure(error)` when an error ended them."""
    async with contextlib.aclosing(items):
        first = await anext(items)  # an error before the first event raises: an HTTP error
        stream = await EventStream(request, headers).open()
        request.app[STREAMS].add(stream)
        try:
            await _pump(stream, first, items, render, trailer, failure)
        except ConnectionError:
            logger.info("HTTP client left a stream; cancelling its requests")
        finally:
            request.app[STREAMS].discard(stream)
    return stream.response


def tgi_error_event(exc: ZtgiError) -> dict[str, str]:
    """TGI's last event of a failed stream."""
    return {"error": exc.message, "error_type": exc.error_type}


async def _pump(stream: EventStream, first: T, items: AsyncIterator[T], render: Render[T],
                trailer: Callable[[], Iterable[Any]], failure: Callable[[ZtgiError], Iterable[Any]]) -> None:
    try:
        for payload in render(first):
            await stream.send(payload)
        async for item in items:
            for payload in render(item):
                await stream.send(payload)
        for payload in trailer():
            await stream.send(payload)
    except ZtgiError as exc:
        for payload in failure(exc):
            await stream.send(payload)
    except asyncio.CancelledError:
        if stream.abort_reason is None:
            raise  # the HTTP client left (or a second cancel): nobody to tell
        task = asyncio.current_task()
        assert task is not None, "a stream is served by a task"
        task.uncancel()
        for payload in failure(ZtgiError(stream.abort_reason["error"], stream.abort_reason["error_type"])):
            await stream.send(payload)
    await stream.close()


async def merge(streams: Sequence[AsyncIterator[StreamEvent]]) -> AsyncGenerator[tuple[int, StreamEvent], None]:
    """Events of several streams as (stream index, event), as they come; the first error raises
    and closing the merge closes (cancels) every stream still open."""
    queue: asyncio.Queue[tuple[int, StreamEvent | None, ZtgiError | None]] = asyncio.Queue()

    async def drain(index: int, events: AsyncIterator[StreamEvent]) -> None:
        try:
            async for event in events:
                queue.put_nowait((index, event, None))
            queue.put_nowait((index, None, None))
        except ZtgiError as exc:
            queue.put_nowait((index, None, exc))

    tasks = [asyncio.create_task(drain(i, events)) for i, events in enumerate(streams)]
    try:
        num_open = len(tasks)
        while num_open:
            index, event, error = await queue.get()
            if error is not None:
                raise error
            if event is None:
                num_open -= 1
                continue
            yield index, event
    finally:
        await _cancel_all(tasks)


async def gather_all(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """All results in order; the first failure (or a cancellation) cancels the others."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return await asyncio.gather(*tasks)
    finally:
        await _cancel_all(tasks)


async def _cancel_all(tasks: Sequence[asyncio.Future]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
