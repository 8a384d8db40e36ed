"""The synchronous client: the asyncio client on an event loop in a background thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.common.client.generate_result import GenerateResult
from ztgi.common.endpoints import DEFAULT_SCHEDULER_URL
from ztgi.common.messages import (
    ChatMessage,
    GenerateParameters,
    HealthReply,
    InfoReply,
    SimpleToken,
    StatsReply,
    StreamEvent,
    Tool,
)

T = TypeVar("T")


class ZtgiClient:
    """The synchronous client: `AsyncZtgiClient` on an event loop in a background thread.

    Same methods; `stream` returns a plain iterator (closing it early cancels the request).
    """

    def __init__(self, scheduler_url: str = DEFAULT_SCHEDULER_URL, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ztgi-client", daemon=True)
        self._thread.start()
        self._client: AsyncZtgiClient = self._call(self._open(scheduler_url, options))

    @staticmethod
    async def _open(scheduler_url: str, options: dict[str, Any]) -> AsyncZtgiClient:
        return await AsyncZtgiClient(scheduler_url, **options).start()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt: the request must not run on unseen
            raise

    def stream(self, inputs: str | None = None, messages: list[ChatMessage] | None = None,
               parameters: GenerateParameters | None = None,
               request_id: str | None = None, tools: list[Tool] | None = None) -> Iterator[StreamEvent]:
        events = self._client.stream(inputs, messages, parameters, request_id, tools)
        try:
            while True:
                try:
                    event = self._call(events.__anext__())
                except StopAsyncIteration:
                    return
                yield event
        finally:
            if not self._loop.is_closed():  # an iterator may outlive its client
                self._call(events.aclose())

    def generate(self, inputs: str | None = None, messages: list[ChatMessage] | None = None,
                 parameters: GenerateParameters | None = None,
                 request_id: str | None = None, tools: list[Tool] | None = None) -> GenerateResult:
        return self._call(self._client.generate(inputs, messages, parameters, request_id, tools))

    def cancel(self, request_id: str) -> None:
        self._call(self._client.cancel(request_id))

    def health(self) -> HealthReply:
        return self._call(self._client.health())

    def info(self) -> InfoReply:
        return self._call(self._client.info())

    def stats(self) -> StatsReply:
        return self._call(self._client.stats())

    def tokenize(self, inputs: str, add_special_tokens: bool = True,
                 truncate: int | None = None) -> list[SimpleToken]:
        return self._call(self._client.tokenize(inputs, add_special_tokens, truncate))

    def load_adapter(self, name: str, path: str) -> None:
        self._call(self._client.load_adapter(name, path))

    def unload_adapter(self, name: str) -> None:
        self._call(self._client.unload_adapter(name))

    def close(self) -> None:
        """Closes the client, stops the loop and joins its thread."""
        if self._loop.is_closed():
            return
        self._call(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> ZtgiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
