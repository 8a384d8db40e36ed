"""The asyncio client of a running server's scheduler.

    async with AsyncZtgiClient("ipc:///tmp/ztgi") as client:
        result = await client.generate("Hello", parameters=GenerateParameters(max_new_tokens=8))
        async for event in client.stream("Hello"):
            print(event.token.text)

A scheduler that restarts or goes silent fails every in-flight request at once with an
`unhealthy` error (`SchedulerConnection` notices, `RequestRouter` ends them), so nothing hangs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

from ztgi.common.client.connection import SchedulerConnection, done_within
from ztgi.common.client.errors import ZtgiError
from ztgi.common.client.generate_result import GenerateResult
from ztgi.common.client.request_router import RequestRouter
from ztgi.common.client.stream_observer import ObserverFactory, StreamObserver
from ztgi.common.curve import CurveKeys
from ztgi.common.endpoints import DEFAULT_SCHEDULER_URL
from ztgi.common.messages import (
    AdapterReply,
    Cancel,
    ChatMessage,
    Generate,
    GenerateParameters,
    HealthReply,
    InfoReply,
    LoadAdapter,
    Query,
    QueryKind,
    SimpleToken,
    StatsReply,
    StreamEvent,
    Token,
    TokenizeQuery,
    TokenizeReply,
    Tool,
    UnloadAdapter,
)

logger = logging.getLogger(__name__)


class AsyncZtgiClient:
    """An asyncio client of the scheduler's `frontend` (one DEALER, one receive task).

    Starts on first use (or `await start()`, or `async with`); `close()` fails what is in flight.
    `query_timeout_s` bounds health/info/stats; `request_timeout_s` (None: no bound) is the
    longest wait for a request's next event before it is cancelled. `observe(parameters)`, when
    given, makes a `StreamObserver` for each request. `curve_keys`
    (`ztgi.common.curve.client_keys(...)`) encrypts the link to a scheduler that runs CURVE; a
    handshake that fails (keys missing or wrong) is logged in plain words, and `handshake.expired`
    says when it has kept failing for `handshake_timeout_s`.
    """

    def __init__(self, scheduler_url: str = DEFAULT_SCHEDULER_URL, *, heartbeat_interval_ms: int = 1000,
                 heartbeat_misses: int = 5, query_timeout_s: float = 5.0,
                 request_timeout_s: float | None = None, curve_keys: CurveKeys | None = None,
                 handshake_timeout_s: float = 30.0) -> None:
        self.connection = SchedulerConnection(scheduler_url, heartbeat_interval_ms, heartbeat_misses,
                                              curve_keys, handshake_timeout_s)
        self.scheduler_url = scheduler_url
        self.handshake = self.connection.handshake
        self.query_timeout_s = query_timeout_s
        self.request_timeout_s = request_timeout_s
        self.observe: ObserverFactory | None = None
        self.router = RequestRouter()
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> AsyncZtgiClient:
        """Connects, says Hello and starts the receive and heartbeat tasks (idempotent)."""
        if self._closed:
            raise ZtgiError("the client is closed", "unhealthy")
        if not self.connection.is_open:
            self.connection.open(self.router.route, self._on_scheduler_lost)
        return self

    def close(self) -> None:
        """Fails in-flight requests and queries, stops the tasks, closes the socket (linger 0)."""
        if self._closed:
            return
        self._closed = True
        self._fail_in_flight("the client was closed", "cancelled")
        self.connection.close()

    async def aclose(self) -> None:
        """`close()`, then waits for the background tasks to finish."""
        self.close()
        await asyncio.gather(*self.connection.tasks, return_exceptions=True)

    async def __aenter__(self) -> AsyncZtgiClient:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- requests ------------------------------------------------------------------------------

    async def stream(self, inputs: str | None = None, messages: list[ChatMessage] | None = None,
                     parameters: GenerateParameters | None = None,
                     request_id: str | None = None, tools: list[Tool] | None = None,
                     input_ids: list[int] | None = None,
                     images: list[bytes] | None = None) -> AsyncGenerator[StreamEvent, None]:
        """Yields a request's events up to and including the final one.

        The prompt is `inputs`, `messages` or `input_ids` (token ids), exactly one of them.
        `images` are the files of the markdown images `![](url)` in `inputs`, in order.
        An error event raises `ZtgiError`. Leaving early (break, exception, task cancellation)
        sends `Cancel`. With `return_full_text`, the final `generated_text` starts with `inputs`.
        """
        parameters = parameters or GenerateParameters()
        request_id = request_id or uuid.uuid4().hex
        # return_full_text is applied here, once, for gateway and direct users alike: the
        # scheduler is sent False so nothing downstream prepends the prompt a second time
        generate = Generate(request_id, inputs, messages,
                            dataclasses.replace(parameters, return_full_text=False), tools, input_ids, images)
        observer = self.observe(parameters) if self.observe is not None else None
        queue = await self._open_request(request_id, observer)
        finished = False
        try:
            self.connection.send(generate)
            while not finished:
                event = await self._next_event(request_id, queue)
                finished = event.is_final
                yield _checked(event, observer, parameters.return_full_text and finished, inputs)
        finally:
            if observer is not None:
                observer.on_close(finished)
            self.router.close_request(request_id)
            if not finished and not self._closed:
                logger.debug("request %s left before its end: cancelling", request_id)
                self.connection.send(Cancel(request_id))

    async def generate(self, inputs: str | None = None, messages: list[ChatMessage] | None = None,
                       parameters: GenerateParameters | None = None,
                       request_id: str | None = None, tools: list[Tool] | None = None,
                       input_ids: list[int] | None = None, images: list[bytes] | None = None) -> GenerateResult:
        """Runs a request to its end and collects its tokens; errors raise `ZtgiError`."""
        tokens: list[Token] = []
        top_tokens: list[list[Token]] = []
        final: StreamEvent | None = None
        async for event in self.stream(inputs, messages, parameters, request_id, tools, input_ids, images):
            if event.token is not None:
                tokens.append(event.token)
                top_tokens.append(event.top_tokens)
            final = event
        assert final is not None and final.generated_text is not None
        return GenerateResult(final.request_id, final.generated_text, tokens, top_tokens, final.details)

    async def cancel(self, request_id: str) -> None:
        """Asks the scheduler to drop one of this client's requests (unknown ids are ignored)."""
        await self.start()
        self.connection.send(Cancel(request_id))

    async def health(self) -> HealthReply:
        return await self._query("health")

    async def info(self) -> InfoReply:
        return await self._query("info")

    async def stats(self) -> StatsReply:
        return await self._query("stats")

    async def tokenize(self, inputs: str, add_special_tokens: bool = True,
                       truncate: int | None = None, messages: list[ChatMessage] | None = None) -> list[SimpleToken]:
        """How a tokenizer of the pipeline splits `inputs` (TGI's /tokenize), or with `messages`
        the chat template's prompt of them; errors raise ZtgiError."""
        reply = await self._tokenize_query(
            lambda query_id: TokenizeQuery(query_id, inputs, add_special_tokens, truncate, messages))
        return reply.tokens

    async def detokenize(self, ids: list[int]) -> str:
        """The text token `ids` decode to (vLLM's /detokenize); errors raise ZtgiError."""
        reply = await self._tokenize_query(lambda query_id: TokenizeQuery(query_id, "", ids=ids))
        return reply.text or ""

    async def load_adapter(self, name: str, path: str) -> None:
        """Registers the LoRA adapter `name` from the directory `path` (vLLM's /v1/load_lora_adapter);
        a refusal raises ZtgiError with error_type `validation`, `not_found` or `conflict`."""
        await self._adapter_query(lambda query_id: LoadAdapter(query_id, name, path), "load_adapter")

    async def unload_adapter(self, name: str) -> None:
        """Removes the LoRA adapter `name`; a refusal raises ZtgiError (`not_found`, or `conflict`
        while requests use it)."""
        await self._adapter_query(lambda query_id: UnloadAdapter(query_id, name), "unload_adapter")

    async def _adapter_query(self, query: Callable[[str], LoadAdapter | UnloadAdapter], kind: str) -> None:
        reply: AdapterReply = await self._ask(query, kind)
        if reply.error is not None:
            raise ZtgiError(reply.error, reply.error_type or "validation")

    async def _tokenize_query(self, query: Callable[[str], TokenizeQuery]) -> TokenizeReply:
        reply: TokenizeReply = await self._ask(query, "tokenize")
        if reply.error is not None:
            raise ZtgiError(reply.error, reply.error_type or "validation")
        return reply

    # -- internals -----------------------------------------------------------------------------

    async def _open_request(self, request_id: str, observer: StreamObserver | None) -> asyncio.Queue[StreamEvent]:
        """The request's queue once the scheduler is reachable; a request that never leaves
        still tells its observer how it ended."""
        try:
            await self.start()
            await self.connection.wait_reachable()
            return self.router.open_request(request_id)
        except ZtgiError as exc:
            if observer is not None:
                observer.on_event(StreamEvent(request_id=request_id, error=exc.message, error_type=exc.error_type))
            raise

    async def _next_event(self, request_id: str, queue: asyncio.Queue[StreamEvent]) -> StreamEvent:
        if self.request_timeout_s is None:
            return await queue.get()
        # a timer that posts a timeout event, not wait_for: before 3.12, wait_for can swallow a
        # cancellation that lands as the event arrives, and a cancelled request must stop
        timer = asyncio.get_running_loop().call_later(self.request_timeout_s, self._expire, request_id, queue)
        try:
            return await queue.get()
        finally:
            timer.cancel()

    def _expire(self, request_id: str, queue: asyncio.Queue[StreamEvent]) -> None:
        if queue.empty():
            error = f"request {request_id} got no event for {self.request_timeout_s:g} s"
            queue.put_nowait(StreamEvent(request_id=request_id, error=error, error_type="timeout"))
            self.connection.send(Cancel(request_id))

    async def _query(self, kind: QueryKind) -> Any:
        return await self._ask(lambda query_id: Query(query_id, kind), kind)

    async def _ask(self, build: Callable[[str], object], kind: str) -> Any:
        """Sends `build(query_id)` and waits for the reply carrying that query_id."""
        await self.start()
        await self.connection.wait_reachable()
        query_id = uuid.uuid4().hex
        future = self.router.open_query(query_id)
        self.connection.send(build(query_id))
        try:
            if not await done_within(future, self.query_timeout_s):
                raise TimeoutError(f"the scheduler did not answer a {kind} query in {self.query_timeout_s:g} s")
            return future.result()
        finally:
            self.router.close_query(query_id)

    def _on_scheduler_lost(self, reason: str) -> None:
        self._fail_in_flight(reason, "unhealthy")

    def _fail_in_flight(self, error: str, error_type: str) -> None:
        """Ends every open stream and pending query; each request is cancelled, as it may still be
        alive somewhere."""
        for request_id in self.router.fail_all(error, error_type):
            if self.connection.can_send:
                self.connection.send(Cancel(request_id))


def _checked(event: StreamEvent, observer: StreamObserver | None, prepend: bool, inputs: str | None) -> StreamEvent:
    """The event as the caller sees it: the observer told, an error raised as `ZtgiError`, and
    with `prepend` (`return_full_text`, final event) `inputs` before the generated text."""
    if observer is not None:
        observer.on_event(event)
    if event.error is not None:
        raise ZtgiError(event.error, event.error_type or "generation")
    if prepend and inputs is not None:
        return dataclasses.replace(event, generated_text=inputs + (event.generated_text or ""))
    return event
