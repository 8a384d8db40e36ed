"""The direct ZMQ client: what users and the gateway both run to talk to the scheduler.

`AsyncZtgiClient` is a DEALER on the scheduler's `frontend`. It says `Hello`, heartbeats, and
runs one receive task that routes every `StreamEvent` to its request's queue by `request_id`
and every query reply to its waiting future by `query_id`. A scheduler that restarts (its
heartbeat nonce changes) or goes silent for `heartbeat_interval_ms * heartbeat_misses` fails
every in-flight request at once with an `unhealthy` error, so nothing hangs.

`ZtgiClient` is the same API, synchronous: it runs an `AsyncZtgiClient` on an event loop in a
background thread.

    async with AsyncZtgiClient("ipc:///tmp/ztgi") as client:
        result = await client.generate("Hello", parameters=GenerateParameters(max_new_tokens=8))
        async for event in client.stream("Hello"):
            print(event.token.text)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from typing import Any, Protocol, TypeVar, cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from ztgi.common import handshake
from ztgi.common.codec import MAX_MESSAGE_BYTES, MessageError, decode, encode
from ztgi.common.curve import CurveKeys
from ztgi.common.curve import apply as apply_curve
from ztgi.common.endpoints import DEFAULT_SCHEDULER_URL, Endpoints
from ztgi.common.identity import new_boot_nonce, new_identity
from ztgi.common.messages import (
    PROTOCOL_VERSION,
    Cancel,
    ChatMessage,
    ErrorReply,
    FinalDetails,
    Generate,
    GenerateParameters,
    HealthReply,
    Heartbeat,
    Hello,
    InfoReply,
    Query,
    QueryKind,
    SimpleToken,
    StatsReply,
    StreamEvent,
    StreamEvents,
    Token,
    TokenizeQuery,
    TokenizeReply,
    Tool,
)

__all__ = ["AsyncZtgiClient", "ZtgiClient", "ZtgiError", "GenerateResult", "StreamObserver"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
INBOUND_MESSAGES = (StreamEvents, HealthReply, InfoReply, StatsReply, TokenizeReply, Heartbeat, ErrorReply)
QueryReply = HealthReply | InfoReply | StatsReply | TokenizeReply


class ZtgiError(Exception):
    """A request failed; `error_type` is TGI's name (validation, overloaded, generation,
    unhealthy, cancelled, timeout)."""

    def __init__(self, message: str, error_type: str = "generation") -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type


class StreamObserver(Protocol):
    """Watches one request's stream (the gateway's metrics): every event as it arrives, then
    the end; `finished` is False when the stream stopped before its final event."""

    def on_event(self, event: StreamEvent) -> None: ...

    def on_close(self, finished: bool) -> None: ...


ObserverFactory = Callable[[GenerateParameters], StreamObserver]


@dataclasses.dataclass
class GenerateResult:
    """A whole generation: its text, every token (with top tokens when asked) and details."""

    request_id: str
    text: str
    tokens: list[Token]
    top_tokens: list[list[Token]]
    details: FinalDetails | None


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
        if heartbeat_interval_ms <= 0 or heartbeat_misses <= 0:
            raise ValueError("heartbeat_interval_ms and heartbeat_misses must be positive")
        self.scheduler_url = scheduler_url
        self.address = Endpoints(scheduler_url).connect("frontend")
        self.identity = new_identity("client")
        self.boot_nonce = new_boot_nonce()
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000.0
        self.liveness_s = self.heartbeat_interval_s * heartbeat_misses
        self.query_timeout_s = query_timeout_s
        self.request_timeout_s = request_timeout_s
        self.curve_keys = curve_keys
        self.handshake = handshake.HandshakeWatch(curve_keys is not None, handshake_timeout_s)
        self.observe: ObserverFactory | None = None
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task] = []
        self._request_id_to_queue: dict[str, asyncio.Queue[StreamEvent]] = {}
        self._query_id_to_future: dict[str, asyncio.Future] = {}
        self._scheduler_nonce: str | None = None
        self._last_heard = 0.0
        self._connected = asyncio.Event()  # set by the scheduler's first word, cleared by its silence
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> AsyncZtgiClient:
        """Connects, says Hello and starts the receive and heartbeat tasks (idempotent)."""
        if self._closed:
            raise ZtgiError("the client is closed", "unhealthy")
        if self._socket is not None:
            return self
        self._context = context = zmq.asyncio.Context()
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.IDENTITY, self.identity)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # libzmq drops a larger frame unread
        apply_curve(socket, self.curve_keys)
        self._monitor = monitor = handshake.watch(socket)
        socket.connect(self.address)
        self._socket = socket
        self._last_heard = time.monotonic()
        self._send(Hello(role="client", protocol_version=PROTOCOL_VERSION, boot_nonce=self.boot_nonce))
        self._tasks = [asyncio.create_task(self._receive_loop(), name="ztgi-client-receive"),
                       asyncio.create_task(self._heartbeat_loop(), name="ztgi-client-heartbeat"),
                       asyncio.create_task(self._handshake_loop(monitor), name="ztgi-client-handshake")]
        logger.info("client %s connecting to %s", self.identity.decode(), self.address)
        return self

    def close(self) -> None:
        """Fails in-flight requests and queries, stops the tasks, closes the socket (linger 0)."""
        if self._closed:
            return
        self._closed = True
        self._fail_in_flight("the client was closed", "cancelled", send_cancel=True)
        for task in self._tasks:
            task.cancel()
        if self._socket is not None and self._monitor is not None and self._context is not None:
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._socket.close(linger=0)
            self._context.term()

    async def aclose(self) -> None:
        """`close()`, then waits for the background tasks to finish."""
        self.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> AsyncZtgiClient:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- requests ------------------------------------------------------------------------------

    async def stream(self, inputs: str | None = None, messages: list[ChatMessage] | None = None,
                     parameters: GenerateParameters | None = None,
                     request_id: str | None = None, tools: list[Tool] | None = None,
                     ) -> AsyncGenerator[StreamEvent, None]:
        """Yields a request's events up to and including the final one.

        An error event raises `ZtgiError`. Leaving early (break, exception, task cancellation)
        sends `Cancel`. With `return_full_text`, the final `generated_text` starts with `inputs`.
        """
        parameters = parameters or GenerateParameters()
        request_id = request_id or uuid.uuid4().hex
        # return_full_text is applied here, once, for gateway and direct users alike: the
        # scheduler is sent False so nothing downstream prepends the prompt a second time
        generate = Generate(request_id, inputs, messages,
                            dataclasses.replace(parameters, return_full_text=False), tools)
        observer = self.observe(parameters) if self.observe is not None else None
        try:
            await self.start()
            await self._wait_reachable()
            queue = self._open_request(request_id)
        except ZtgiError as exc:  # the request never left, but its observer still hears how it ended
            if observer is not None:
                observer.on_event(StreamEvent(request_id=request_id, error=exc.message, error_type=exc.error_type))
            raise
        finished = False
        try:
            self._send(generate)
            while not finished:
                event = await self._next_event(request_id, queue)
                finished = event.is_final
                if observer is not None:
                    observer.on_event(event)
                if event.error is not None:
                    raise ZtgiError(event.error, event.error_type or "generation")
                if finished and parameters.return_full_text and inputs is not None:
                    event = dataclasses.replace(event, generated_text=inputs + (event.generated_text or ""))
                yield event
        finally:
            if observer is not None:
                observer.on_close(finished)
            self._request_id_to_queue.pop(request_id, None)
            if not finished and not self._closed:
                logger.debug("request %s left before its end: cancelling", request_id)
                self._send(Cancel(request_id))

    async def generate(self, inputs: str | None = None, messages: list[ChatMessage] | None = None,
                       parameters: GenerateParameters | None = None,
                       request_id: str | None = None, tools: list[Tool] | None = None) -> GenerateResult:
        """Runs a request to its end and collects its tokens; errors raise `ZtgiError`."""
        tokens: list[Token] = []
        top_tokens: list[list[Token]] = []
        final: StreamEvent | None = None
        async for event in self.stream(inputs, messages, parameters, request_id, tools):
            if event.token is not None:
                tokens.append(event.token)
                top_tokens.append(event.top_tokens)
            final = event
        assert final is not None and final.generated_text is not None
        return GenerateResult(final.request_id, final.generated_text, tokens, top_tokens, final.details)

    async def cancel(self, request_id: str) -> None:
        """Asks the scheduler to drop one of this client's requests (unknown ids are ignored)."""
        await self.start()
        self._send(Cancel(request_id))

    async def health(self) -> HealthReply:
        return await self._query("health")

    async def info(self) -> InfoReply:
        return await self._query("info")

    async def stats(self) -> StatsReply:
        return await self._query("stats")

    async def tokenize(self, inputs: str, add_special_tokens: bool = True,
                       truncate: int | None = None) -> list[SimpleToken]:
        """How a tokenizer of the pipeline splits `inputs` (TGI's /tokenize); errors raise ZtgiError."""
        reply: TokenizeReply = await self._ask(
            lambda query_id: TokenizeQuery(query_id, inputs, add_special_tokens, truncate), "tokenize")
        if reply.error is not None:
            raise ZtgiError(reply.error, reply.error_type or "validation")
        return reply.tokens

    # -- internals -----------------------------------------------------------------------------

    def _open_request(self, request_id: str) -> asyncio.Queue[StreamEvent]:
        if request_id in self._request_id_to_queue:
            raise ZtgiError(f"request_id {request_id!r} is already in flight on this client", "validation")
        queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self._request_id_to_queue[request_id] = queue
        return queue

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
            self._send(Cancel(request_id))

    async def _query(self, kind: QueryKind) -> Any:
        return await self._ask(lambda query_id: Query(query_id, kind), kind)

    async def _ask(self, build: Callable[[str], object], kind: str) -> Any:
        """Sends `build(query_id)` and waits for the reply carrying that query_id."""
        await self.start()
        await self._wait_reachable()
        query_id = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self._query_id_to_future[query_id] = future
        self._send(build(query_id))
        try:
            if not await _wait(future, self.query_timeout_s):
                raise TimeoutError(f"the scheduler did not answer a {kind} query in {self.query_timeout_s:g} s")
            return future.result()
        finally:
            self._query_id_to_future.pop(query_id, None)

    async def _wait_reachable(self) -> None:
        """Waits for a first word from the scheduler, or fails fast once it counts as gone."""
        if self._connected.is_set():
            return
        remaining_s = self._last_heard + self.liveness_s - time.monotonic()
        waiter = asyncio.ensure_future(self._connected.wait())
        try:
            if not await _wait(waiter, max(0.0, remaining_s)):
                why = f": {self.handshake.failure}" if self.handshake.failure else ""
                raise ZtgiError(f"the scheduler at {self.scheduler_url} is unreachable{why}", "unhealthy")
        finally:
            waiter.cancel()

    def _send(self, msg: object) -> None:
        """Queues a frame on the socket without waiting (the DEALER queues while disconnected)."""
        future = cast(asyncio.Future, self._live_socket.send(encode(msg), zmq.NOBLOCK))  # an asyncio socket's
        future.add_done_callback(lambda done: self._check_sent(done, msg))

    @property
    def _live_socket(self) -> zmq.asyncio.Socket:
        assert self._socket is not None, "the client is used before start()"
        return self._socket

    @staticmethod
    def _check_sent(future: asyncio.Future, msg: object) -> None:
        if future.cancelled() or future.exception() is None:
            return
        # Again: the high-water mark is reached (a long outage); heartbeats are expendable
        level = logging.DEBUG if isinstance(msg, Heartbeat) else logging.WARNING
        logger.log(level, "could not send %s: %s", type(msg).__name__, future.exception())

    async def _receive_loop(self) -> None:
        """Decodes every frame from the scheduler and routes it; bad frames are logged."""
        while True:
            frames = await self._live_socket.recv_multipart()
            self._last_heard = time.monotonic()
            self._connected.set()
            if len(frames) != 1:
                logger.warning("dropped a message of %d frames from the scheduler", len(frames))
                continue
            try:
                msg = decode(frames[0], INBOUND_MESSAGES)
            except MessageError as exc:
                logger.warning("bad frame from the scheduler: %s", exc)
                continue
            try:
                self._dispatch(msg)
            except Exception:  # one bad message must not stop the routing of every other
                logger.exception("could not route %s", type(msg).__name__)

    def _dispatch(self, msg: object) -> None:
        match msg:
            case StreamEvents():
                for event in msg.events:
                    self._route_event(event)
            case HealthReply() | InfoReply() | StatsReply() | TokenizeReply():
                future = self._query_id_to_future.get(msg.query_id)
                if future is not None and not future.done():
                    future.set_result(msg)
            case Heartbeat():
                self._on_scheduler_heartbeat(msg.boot_nonce)
            case ErrorReply():
                logger.warning("the scheduler could not read a frame of ours: %s", msg.error)

    def _route_event(self, event: StreamEvent) -> None:
        queue = self._request_id_to_queue.get(event.request_id)
        if queue is None:
            logger.debug("event for request %s that is no longer in flight: dropped", event.request_id)
            return
        queue.put_nowait(event)

    def _on_scheduler_heartbeat(self, nonce: str) -> None:
        if self._scheduler_nonce is not None and nonce != self._scheduler_nonce:
            logger.warning("the scheduler restarted: failing %d in-flight requests",
                           len(self._request_id_to_queue))
            self._fail_in_flight("scheduler restarted", "unhealthy", send_cancel=True)
            self._send(Hello(role="client", protocol_version=PROTOCOL_VERSION, boot_nonce=self.boot_nonce))
        self._scheduler_nonce = nonce

    async def _handshake_loop(self, monitor: zmq.asyncio.Socket) -> None:
        """Reads the socket monitor's handshake events; a failure is logged once, in words."""
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            failure = self.handshake.on_event(event["event"], event["value"])
            if failure is not None:
                logger.error("cannot connect to the scheduler at %s: %s", self.scheduler_url, failure)

    async def _heartbeat_loop(self) -> None:
        """Heartbeats every interval and fails in-flight work when the scheduler goes silent."""
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            self._send(Heartbeat(self.boot_nonce))
            silent_s = time.monotonic() - self._last_heard
            if silent_s > self.liveness_s and self._connected.is_set():
                logger.warning("no word from the scheduler for %.1f s", silent_s)
                self._connected.clear()
                self._fail_in_flight(f"the scheduler at {self.scheduler_url} did not answer for "
                                     f"{silent_s:.1f} s", "unhealthy", send_cancel=True)

    def _fail_in_flight(self, error: str, error_type: str, send_cancel: bool) -> None:
        """Ends every open stream with an error event and every pending query with ZtgiError."""
        for request_id, queue in list(self._request_id_to_queue.items()):
            queue.put_nowait(StreamEvent(request_id=request_id, error=error, error_type=error_type))
            if send_cancel and self._socket is not None and not self._socket.closed:
                self._send(Cancel(request_id))  # the request may still be alive somewhere
        for future in self._query_id_to_future.values():
            if not future.done():
                future.set_exception(ZtgiError(error, error_type))


async def _wait(future: asyncio.Future, timeout_s: float) -> bool:
    """Whether `future` is done within `timeout_s`; unlike `wait_for` before Python 3.12, never
    swallows a cancellation of the caller."""
    done, _ = await asyncio.wait({future}, timeout=timeout_s)
    return bool(done)


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
