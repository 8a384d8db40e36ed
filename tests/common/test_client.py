"""The direct ZMQ client against a scripted scheduler frontend (real sockets, no mocks)."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.gateway.scripted_scheduler import ScriptedScheduler, error_steps, token_steps
from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.common.client.errors import ZtgiError
from ztgi.common.client.sync_client import ZtgiClient
from ztgi.common.messages import (
    PROTOCOL_VERSION,
    Cancel,
    ChatMessage,
    Generate,
    GenerateParameters,
    Hello,
    InfoReply,
    LoadAdapter,
    StatsReply,
    UnloadAdapter,
)

FAST = {"heartbeat_interval_ms": 50, "heartbeat_misses": 4, "query_timeout_s": 1.0}


@pytest.fixture
def scheduler_url() -> str:
    run_dir = tempfile.mkdtemp(prefix="ztgi-")  # ipc paths must stay short
    yield f"ipc://{run_dir}"
    shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def scheduler(scheduler_url: str) -> ScriptedScheduler:
    scheduler = ScriptedScheduler(scheduler_url).start()
    yield scheduler
    scheduler.stop()


def run(scheduler_url: str, body: Callable[[AsyncZtgiClient], Awaitable[Any]], **options: Any) -> Any:
    """Runs `body(client)` on a fresh event loop with a started client, then closes it."""
    async def main() -> Any:
        async with AsyncZtgiClient(scheduler_url, **{**FAST, **options}) as client:
            return await body(client)
    return asyncio.run(main())


def test_generate_collects_tokens_text_and_details(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """generate() returns the final text, every token with its top tokens, and the details."""
    parameters = GenerateParameters(max_new_tokens=4, top_n_tokens=2, seed=7)
    result = run(scheduler_url, lambda c: c.generate("Hi", parameters=parameters, request_id="r1"))
    assert result.request_id == "r1"
    assert result.text == " a b c d"
    assert [t.text for t in result.tokens] == [" a", " b", " c", " d"]
    assert [len(top) for top in result.top_tokens] == [2, 2, 2, 2]
    assert (result.details.finish_reason, result.details.generated_tokens, result.details.seed) == ("length", 4, 7)
    sent = scheduler.messages(Generate)[0]
    assert (sent.request_id, sent.inputs, sent.parameters.max_new_tokens) == ("r1", "Hi", 4)


def test_client_says_hello_first(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """The first frame a client sends is Hello{role=client} with the protocol version."""
    run(scheduler_url, lambda c: c.health())
    first = scheduler.received[0][1]
    assert isinstance(first, Hello) and first.role == "client" and first.protocol_version == PROTOCOL_VERSION


def test_stream_yields_events_in_order_and_ends_on_final(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """stream() yields one event per token; only the last carries generated_text."""
    async def body(client: AsyncZtgiClient) -> list:
        return [e async for e in client.stream("Hi", parameters=GenerateParameters(max_new_tokens=3))]
    events = run(scheduler_url, body)
    assert [e.token.text for e in events] == [" a", " b", " c"]
    assert [e.generated_text for e in events] == [None, None, " a b c"]
    assert len({e.request_id for e in events}) == 1 and len(events[0].request_id) == 32


def test_return_full_text_prepends_the_prompt_client_side(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """return_full_text puts the prompt before the text; the scheduler is asked for the text only."""
    parameters = GenerateParameters(max_new_tokens=2, return_full_text=True)
    result = run(scheduler_url, lambda c: c.generate("Say:", parameters=parameters))
    assert result.text == "Say: a b"
    assert scheduler.messages(Generate)[0].parameters.return_full_text is False


def test_chat_messages_travel_as_messages(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """messages= sends a Generate with chat messages and no inputs."""
    run(scheduler_url, lambda c: c.generate(messages=[ChatMessage("user", "Hello")]))
    sent = scheduler.messages(Generate)[0]
    assert sent.inputs is None and sent.messages == [ChatMessage("user", "Hello")]


def test_error_event_raises_ztgi_error(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """An overloaded error event raises ZtgiError with error_type 'overloaded'."""
    scheduler.script = lambda g: error_steps(g.request_id, "Model is overloaded", "overloaded")
    with pytest.raises(ZtgiError) as caught:
        run(scheduler_url, lambda c: c.generate("Hi"))
    assert (caught.value.message, caught.value.error_type) == ("Model is overloaded", "overloaded")


def test_error_mid_stream_ends_the_stream_by_raising(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """Tokens before an error are yielded, then the error raises from the iterator."""
    scheduler.script = lambda g: error_steps(g.request_id, "worker died", "generation", after_texts=[" x"])
    seen: list = []

    async def body(client: AsyncZtgiClient) -> None:
        async for event in client.stream("Hi"):
            seen.append(event.token.text)
    with pytest.raises(ZtgiError, match="worker died"):
        run(scheduler_url, body)
    assert seen == [" x"]
    assert not scheduler.messages(Cancel)  # the request ended: nothing to cancel


def test_leaving_a_stream_early_sends_cancel(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """Breaking out of stream() before the final event sends Cancel for that request."""
    scheduler.script = lambda g: token_steps(g.request_id, [" t"] * 200)

    async def body(client: AsyncZtgiClient) -> None:
        async with contextlib.aclosing(client.stream("Hi", request_id="early")) as events:
            async for _ in events:
                break
    run(scheduler_url, body)
    assert scheduler.wait_for(lambda m: isinstance(m, Cancel)).request_id == "early"


def test_cancelling_the_consumer_task_sends_cancel(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """Cancelling the task that awaits generate() sends Cancel for its request."""
    scheduler.script = lambda g: token_steps(g.request_id, [" t"] * 200)

    async def body(client: AsyncZtgiClient) -> None:
        task = asyncio.create_task(client.generate("Hi", request_id="doomed"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    run(scheduler_url, body)
    assert scheduler.wait_for(lambda m: isinstance(m, Cancel)).request_id == "doomed"


def test_cancel_sends_cancel_for_the_request_id(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """cancel(request_id) sends Cancel{request_id}."""
    async def body(client: AsyncZtgiClient) -> None:
        await client.cancel("abc")
        await client.health()  # one round trip: the Cancel before it has arrived too
    run(scheduler_url, body)
    assert scheduler.wait_for(lambda m: isinstance(m, Cancel)).request_id == "abc"


def test_duplicate_request_id_in_flight_is_refused(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """A request_id already streaming on this client is a validation error, not a mix-up."""
    scheduler.script = lambda g: token_steps(g.request_id, [" t"] * 10)

    async def body(client: AsyncZtgiClient) -> None:
        first = asyncio.create_task(client.generate("Hi", request_id="same"))
        await asyncio.sleep(0.05)
        with pytest.raises(ZtgiError) as caught:
            await client.generate("Hi", request_id="same")
        assert caught.value.error_type == "validation"
        await first
    run(scheduler_url, body)


def test_queries_resolve_by_query_id(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """health(), info() and stats() send Query and return the matching replies."""
    scheduler.health = (False, "no worker is ready")

    async def body(client: AsyncZtgiClient) -> tuple:
        return await asyncio.gather(client.health(), client.info(), client.stats())
    health, info, stats = run(scheduler_url, body)
    assert (health.healthy, health.reason) == (False, "no worker is ready")
    assert isinstance(info, InfoReply) and info.model_id == "test/tiny"
    assert isinstance(stats, StatsReply) and stats.num_tokenizers == 2


def test_adapter_commands_resolve_by_query_id(scheduler: ScriptedScheduler, scheduler_url: str,
                                              tmp_path: pathlib.Path) -> None:
    """load_adapter() and unload_adapter() send their commands and return once the scheduler agrees;
    info() then lists what is loaded."""
    async def body(client: AsyncZtgiClient) -> tuple[list[str], list[str]]:
        await asyncio.gather(client.load_adapter("a", str(tmp_path)), client.load_adapter("b", str(tmp_path)))
        loaded = (await client.info()).lora_adapters
        await client.unload_adapter("a")
        return loaded, (await client.info()).lora_adapters
    loaded, left = run(scheduler_url, body)
    assert sorted(loaded) == ["a", "b"] and left == ["b"]
    assert {(m.name, m.path) for m in scheduler.messages(LoadAdapter)} == {("a", str(tmp_path)), ("b", str(tmp_path))}
    assert [m.name for m in scheduler.messages(UnloadAdapter)] == ["a"]


@pytest.mark.parametrize("command,error_type", [
    (lambda c, path: c.load_adapter("taken", path), "conflict"),
    (lambda c, path: c.load_adapter("new", path + "/missing"), "validation"),
    (lambda c, path: c.unload_adapter("unknown"), "not_found"),
    (lambda c, path: c.unload_adapter("busy"), "conflict"),
], ids=["name-taken", "bad-path", "unknown-name", "in-use"])
def test_adapter_refusals_raise_ztgi_error(scheduler: ScriptedScheduler, scheduler_url: str, tmp_path: pathlib.Path,
                                           command: Callable[[AsyncZtgiClient, str], Awaitable[None]],
                                           error_type: str) -> None:
    """A refused adapter command raises ZtgiError with the scheduler's message and error_type."""
    scheduler.adapter_to_path.update(taken=str(tmp_path), busy=str(tmp_path))
    scheduler.busy_adapters.add("busy")
    with pytest.raises(ZtgiError) as caught:
        run(scheduler_url, lambda c: command(c, str(tmp_path)))
    assert caught.value.error_type == error_type and caught.value.message


def test_unanswered_query_times_out(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """A query the scheduler never answers raises TimeoutError after query_timeout_s."""
    scheduler.answer_queries = False
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        run(scheduler_url, lambda c: c.health(), query_timeout_s=0.3)
    assert time.monotonic() - started < 2


def test_request_timeout_cancels_a_silent_request(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """No event within request_timeout_s: ZtgiError 'timeout', and Cancel is sent."""
    scheduler.script = lambda g: []
    with pytest.raises(ZtgiError) as caught:
        run(scheduler_url, lambda c: c.generate("Hi", request_id="slow"), request_timeout_s=0.2)
    assert caught.value.error_type == "timeout"
    assert scheduler.wait_for(lambda m: isinstance(m, Cancel)).request_id == "slow"


def test_scheduler_restart_fails_in_flight_requests_fast(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """A new scheduler nonce fails in-flight requests at once ('scheduler restarted') and re-Hellos."""
    scheduler.script = lambda g: token_steps(g.request_id, [" t"] * 1000)

    async def body(client: AsyncZtgiClient) -> float:
        task = asyncio.create_task(client.generate("Hi"))
        await asyncio.sleep(0.1)
        scheduler.restart()
        restarted = time.monotonic()
        with pytest.raises(ZtgiError) as caught:
            await task
        assert (caught.value.message, caught.value.error_type) == ("scheduler restarted", "unhealthy")
        failed_after_s = time.monotonic() - restarted
        # the second Hello leaves as the requests fail; the scheduler's thread reads it a moment later,
        # and the client stays open until then (closing drops what it has not sent)
        deadline = time.monotonic() + 5.0
        while len(scheduler.messages(Hello)) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return failed_after_s
    assert run(scheduler_url, body) < 2.0
    assert len(scheduler.messages(Hello)) == 2


def test_silent_scheduler_fails_in_flight_requests(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """A scheduler that stops answering fails in-flight requests after the heartbeat window."""
    scheduler.script = lambda g: token_steps(g.request_id, [" t"] * 1000)

    async def body(client: AsyncZtgiClient) -> None:
        task = asyncio.create_task(client.generate("Hi"))
        await asyncio.sleep(0.1)
        scheduler.stop()
        with pytest.raises(ZtgiError) as caught:
            await asyncio.wait_for(task, 2.0)
        assert caught.value.error_type == "unhealthy" and "did not answer" in caught.value.message
        with pytest.raises(ZtgiError, match="unreachable"):  # later requests fail fast
            await asyncio.wait_for(client.generate("Hi"), 0.1)
    run(scheduler_url, body)


def test_no_scheduler_is_a_clear_unhealthy_error(scheduler_url: str) -> None:
    """With nothing bound, a request fails with 'unreachable' within the heartbeat window."""
    started = time.monotonic()
    with pytest.raises(ZtgiError) as caught:
        run(scheduler_url, lambda c: c.generate("Hi"))
    assert caught.value.error_type == "unhealthy" and "unreachable" in caught.value.message
    assert time.monotonic() - started < 1.5


def test_sync_client_generate_stream_and_queries(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """ZtgiClient offers the same API synchronously; stream() is a plain iterator."""
    with ZtgiClient(scheduler_url, **FAST) as client:
        result = client.generate("Hi", parameters=GenerateParameters(max_new_tokens=2))
        texts = [e.token.text for e in client.stream("Hi", parameters=GenerateParameters(max_new_tokens=3))]
        assert client.health().healthy and client.info().model_id == "test/tiny"
        assert client.stats().num_workers == 1
        client.load_adapter("sync", tempfile.gettempdir())
        assert client.info().lora_adapters == ["sync"]
        client.unload_adapter("sync")
        with pytest.raises(ZtgiError):
            client.unload_adapter("sync")
    assert result.text == " a b"
    assert texts == [" a", " b", " c"]


def test_sync_client_closing_a_stream_early_sends_cancel(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """Closing the sync iterator before the end cancels the request."""
    scheduler.script = lambda g: token_steps(g.request_id, [" t"] * 200)
    with ZtgiClient(scheduler_url, **FAST) as client:
        events = client.stream("Hi", request_id="sync-early")
        next(events)
        events.close()
        assert scheduler.wait_for(lambda m: isinstance(m, Cancel)).request_id == "sync-early"


def test_sync_client_raises_ztgi_error(scheduler: ScriptedScheduler, scheduler_url: str) -> None:
    """Errors reach sync callers as ZtgiError with the error_type."""
    scheduler.script = lambda g: error_steps(g.request_id, "too long", "validation")
    with ZtgiClient(scheduler_url, **FAST) as client:
        with pytest.raises(ZtgiError) as caught:
            client.generate("Hi")
    assert caught.value.error_type == "validation"
