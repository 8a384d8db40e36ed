"""The floor under a first token's messages: its eight ZMQ hops between processes that do nothing.

    python -m studies.hop_floor --messages 300 --gap-ms 25

A first token crosses the scheduler eight times: client -> scheduler -> tokenizer (encode) ->
scheduler -> worker (prefill) -> scheduler -> tokenizer (detokenize) -> scheduler -> client.
Here a hub process binds a ROUTER as the scheduler does, a tokenizer and a worker process connect
DEALERs, and the client's message takes that route with no work at any stop: what is left is
pyzmq, libzmq's I/O threads and the kernel waking each process. `--gap-ms` spaces the messages
(25 ms is about a short prompt's prefill on a 2-core CPU, long enough for idle cores to sleep);
`--gap-ms 0` sends them back to back. Prints p10/p50/p90 of the route, whole and per hop. ztgi's
own path adds HTTP at both ends and each service's work to this. `--http` times that exchange
bare instead: an aiohttp server (on uvloop, as the gateway) answering `POST /generate_stream`
with one SSE event at once, and an aiohttp client reading up to it, as `ztgi bench` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

import aiohttp
import uvloop
import zmq
from aiohttp import web

from ztgi.common.config import ConfigError, parse_config, require
from ztgi.common.free_ports import free_port

NUM_HOPS = 8
ROUTE = {  # the hub's routing: the stop a message has just left -> (the next peer, the stop there)
    b"client": (b"tokenizer", b"encode"),
    b"encode": (b"worker", b"prefill"),
    b"prefill": (b"tokenizer", b"detokenize"),
    b"detokenize": (b"client", b"done"),
}
PAYLOAD = b"x" * 100  # about the size of a one-token StepResult
ANSWER_TIMEOUT_MS = 5000
STOP_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class HopFloorConfig:
    """The first token's message route with no work at any stop."""

    messages: int = dataclasses.field(default=300, metadata={"help": "messages timed, one at a time (>= 2)"})
    gap_ms: float = dataclasses.field(default=25.0, metadata={"help": "pause between messages"})
    warmup: int = dataclasses.field(default=20, metadata={"help": "untimed messages first"})
    http: bool = dataclasses.field(default=False, metadata={
        "help": "time a bare HTTP request to its first SSE event instead of the ZMQ route"})

    def __post_init__(self) -> None:
        require(self.messages >= 2, f"--messages must be >= 2, got {self.messages}")
        require(self.gap_ms >= 0, f"--gap-ms must be >= 0, got {self.gap_ms}")
        require(self.warmup >= 0, f"--warmup must be >= 0, got {self.warmup}")


def run_hub(address: str) -> None:
    """The scheduler's place: forwards each message to the next stop of its route."""
    _stop_on_sigterm()
    router = zmq.Context().socket(zmq.ROUTER)
    router.bind(address)
    while True:
        _, stop, payload = router.recv_multipart()
        if stop in ROUTE:
            peer, next_stop = ROUTE[stop]
            router.send_multipart([peer, next_stop, payload])


def run_peer(address: str, identity: bytes) -> None:
    """A tokenizer or a worker: hands every message straight back to the hub."""
    _stop_on_sigterm()
    dealer = _dealer(zmq.Context(), address, identity)
    while True:
        dealer.send_multipart(dealer.recv_multipart())


def _stop_on_sigterm() -> None:
    """A forked process inherits its parent's signal dispositions: one that ignores SIGTERM (or
    drains on it) would leave `terminate` without effect and the parent's exit waiting on it."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stop(processes: Sequence[multiprocessing.Process]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(STOP_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()


def _dealer(context: zmq.Context, address: str, identity: bytes) -> zmq.Socket:
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, identity)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    dealer.send_multipart([b"hello", b""])  # the hub learns the identity before anything is routed to it
    return dealer


def time_route(address: str, config: HopFloorConfig) -> list[float]:
    """Microseconds per message over the whole route, after the warmup ones."""
    context = zmq.Context()
    client = _dealer(context, address, b"client")
    client.setsockopt(zmq.RCVTIMEO, ANSWER_TIMEOUT_MS)  # a peer that never connected: zmq.Again
    times = []
    try:
        for index in range(config.warmup + config.messages):
            started = time.perf_counter_ns()
            client.send_multipart([b"client", PAYLOAD])
            client.recv_multipart()
            if index >= config.warmup:
                times.append((time.perf_counter_ns() - started) / 1000)
            time.sleep(config.gap_ms / 1000)
    finally:
        context.destroy(linger=0)
    return times


def run_http_server(port: int) -> None:
    """The gateway's place: one SSE event for every POST /generate_stream, at once."""
    _stop_on_sigterm()
    async def generate_stream(request: web.Request) -> web.StreamResponse:
        await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"token": {"id": 1, "text": "x", "logprob": 0.0, "special": false}}\n\n')
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/generate_stream", generate_stream)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=False)


async def time_http(url: str, config: HopFloorConfig) -> list[float]:
    """Microseconds from sending each request to reading its first `data:` line."""
    body = {"inputs": "x" * 100, "parameters": {"max_new_tokens": 20}}
    times = []
    async with aiohttp.ClientSession() as session:
        for index in range(config.warmup + config.messages):
            started = time.perf_counter_ns()
            async with session.post(url, json=body) as response:
                async for line in response.content:
                    if line.startswith(b"data:"):
                        json.loads(line[5:])
                        break
                await response.read()
            if index >= config.warmup:
                times.append((time.perf_counter_ns() - started) / 1000)
            await asyncio.sleep(config.gap_ms / 1000)
    return times


async def _http_times(port: int, config: HopFloorConfig) -> list[float]:
    url = f"http://127.0.0.1:{port}/generate_stream"
    async with aiohttp.ClientSession() as session:
        for _ in range(100):  # the server process is starting
            try:
                async with session.post(url, json={}) as response:
                    await response.read()
                break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
    return await time_http(url, config)


def render(times: list[float], config: HopFloorConfig) -> str:
    deciles = statistics.quantiles(times, n=10, method="inclusive")
    p10, p50, p90 = deciles[0], deciles[4], deciles[8]
    if config.http:
        return (f"HTTP request to first SSE event, {len(times)} requests {config.gap_ms:g} ms apart: "
                f"p50 {p50:.0f} us (p10 {p10:.0f}, p90 {p90:.0f})\n")
    return (f"{NUM_HOPS} hops, {len(times)} messages {config.gap_ms:g} ms apart: p50 {p50:.0f} us "
            f"(p10 {p10:.0f}, p90 {p90:.0f}); per hop p50 {p50 / NUM_HOPS:.0f} us\n")


def measure_http(config: HopFloorConfig) -> list[float]:
    port = free_port()
    server = multiprocessing.Process(target=run_http_server, args=(port,), daemon=True)
    server.start()
    try:
        return asyncio.run(_http_times(port, config))
    finally:
        _stop([server])


def measure_route(config: HopFloorConfig) -> list[float]:
    """The hub and its two peers as processes; raises zmq.Again when one never answers."""
    with tempfile.TemporaryDirectory(prefix="ztgi-hops-") as run_dir:
        address = f"ipc://{run_dir}/hub"
        processes = [multiprocessing.Process(target=run_hub, args=(address,), daemon=True)]
        processes += [multiprocessing.Process(target=run_peer, args=(address, identity), daemon=True)
                      for identity in (b"tokenizer", b"worker")]
        for process in processes:
            process.start()
        time.sleep(0.5)  # every peer connected and greeted
        try:
            return time_route(address, config)
        finally:
            _stop(processes)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_config(HopFloorConfig, argv, prog="python -m studies.hop_floor")
    except ConfigError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    try:
        times = measure_http(config) if config.http else measure_route(config)
    except zmq.Again:
        sys.stderr.write(f"no answer within {ANSWER_TIMEOUT_MS} ms: a peer did not start\n")
        return 1
    sys.stdout.write(render(times, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
