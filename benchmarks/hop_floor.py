"""The floor under a first token's messages: its eight ZMQ hops between processes that do nothing.

    python -m benchmarks.hop_floor --messages 300 --gap-ms 25

A first token crosses the scheduler eight times: client -> scheduler -> tokenizer (encode) ->
scheduler -> worker (prefill) -> scheduler -> tokenizer (detokenize) -> scheduler -> client.
Here a hub process binds a ROUTER as the scheduler does, a tokenizer and a worker process connect
DEALERs, and the client's message takes that route with no work at any stop: what is left is
pyzmq, libzmq's I/O threads and the kernel waking each process. `--gap-ms` spaces the messages
(25 ms is about a short prompt's prefill on a 2-core CPU, long enough for idle cores to sleep);
`--gap-ms 0` sends them back to back. Prints p10/p50/p90 of the route, whole and per hop. ztgi's
own path adds HTTP at both ends and each service's work to this.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import statistics
import sys
import tempfile
import time
from typing import Sequence

import zmq

from common.config import ConfigError, parse_config, require

NUM_HOPS = 8
ROUTE = {  # the hub's routing: the stop a message has just left -> (the next peer, the stop there)
    b"client": (b"tokenizer", b"encode"),
    b"encode": (b"worker", b"prefill"),
    b"prefill": (b"tokenizer", b"detokenize"),
    b"detokenize": (b"client", b"done"),
}
PAYLOAD = b"x" * 100  # about the size of a one-token StepResult
ANSWER_TIMEOUT_MS = 5000


@dataclasses.dataclass(frozen=True)
class HopFloorConfig:
    """The first token's message route with no work at any stop."""

    messages: int = dataclasses.field(default=300, metadata={"help": "messages timed, one at a time (>= 2)"})
    gap_ms: float = dataclasses.field(default=25.0, metadata={"help": "pause between messages"})
    warmup: int = dataclasses.field(default=20, metadata={"help": "untimed messages first"})

    def __post_init__(self) -> None:
        require(self.messages >= 2, f"--messages must be >= 2, got {self.messages}")
        require(self.gap_ms >= 0, f"--gap-ms must be >= 0, got {self.gap_ms}")
        require(self.warmup >= 0, f"--warmup must be >= 0, got {self.warmup}")


def run_hub(address: str) -> None:
    """The scheduler's place: forwards each message to the next stop of its route."""
    router = zmq.Context().socket(zmq.ROUTER)
    router.bind(address)
    while True:
        _, stop, payload = router.recv_multipart()
        if stop in ROUTE:
            peer, next_stop = ROUTE[stop]
            router.send_multipart([peer, next_stop, payload])


def run_peer(address: str, identity: bytes) -> None:
    """A tokenizer or a worker: hands every message straight back to the hub."""
    dealer = _dealer(zmq.Context(), address, identity)
    while True:
        dealer.send_multipart(dealer.recv_multipart())


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


def render(times: list[float], config: HopFloorConfig) -> str:
    deciles = statistics.quantiles(times, n=10, method="inclusive")
    p10, p50, p90 = deciles[0], deciles[4], deciles[8]
    return (f"{NUM_HOPS} hops, {len(times)} messages {config.gap_ms:g} ms apart: p50 {p50:.0f} us "
            f"(p10 {p10:.0f}, p90 {p90:.0f}); per hop p50 {p50 / NUM_HOPS:.0f} us\n")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_config(HopFloorConfig, argv, prog="python -m benchmarks.hop_floor")
    except ConfigError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    with tempfile.TemporaryDirectory(prefix="ztgi-hops-") as run_dir:
        address = f"ipc://{run_dir}/hub"
        processes = [multiprocessing.Process(target=run_hub, args=(address,), daemon=True)]
        processes += [multiprocessing.Process(target=run_peer, args=(address, identity), daemon=True)
                      for identity in (b"tokenizer", b"worker")]
        for process in processes:
            process.start()
        time.sleep(0.5)  # every peer connected and greeted
        try:
            times = time_route(address, config)
        except zmq.Again:
            sys.stderr.write(f"no answer within {ANSWER_TIMEOUT_MS} ms: a peer did not start\n")
            return 1
        finally:
            for process in processes:
                process.terminate()
    sys.stdout.write(render(times, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
