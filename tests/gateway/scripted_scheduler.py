"""A test neighbour that plays the scheduler's `frontend`: real ROUTER socket, scripted answers.

It binds `Endpoints(url).bind("frontend")` in a thread, answers Hello/Heartbeat with its boot
nonce and queries with canned replies, and plays each `Generate` through `script`: a list of
steps, one `StreamEvents` message per step, `step_delay_s` apart. A `Cancel` stops a playback.
LoadAdapter and UnloadAdapter are answered as the scheduler would, on a registry of names: a
taken name, or an adapter in `busy_adapters`, is a conflict; a path that is not a directory a
validation error; an unknown name not found. Everything it receives is recorded for the test to
inspect.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from ztgi.common.codec import decode, encode
from ztgi.common.endpoints import Endpoints
from ztgi.common.identity import new_boot_nonce
from ztgi.common.messages import (
    AdapterReply,
    Cancel,
    FinalDetails,
    Generate,
    HealthReply,
    Heartbeat,
    Hello,
    InfoReply,
    LoadAdapter,
    Query,
    SimpleToken,
    StatsReply,
    StreamEvent,
    StreamEvents,
    Token,
    TokenizeQuery,
    TokenizeReply,
    UnloadAdapter,
)

Steps = list[list[StreamEvent]]
GENERATION_PROMPT = "<|im_start|>assistant\n"
"""What its chat template adds after the turns (a reasoning model's may end with `<think>`)."""
Script = Callable[[Generate], Steps]


def token_steps(request_id: str, texts: list[str], finish_reason: str = "length", input_tokens: int = 3,
                seed: int | None = None, top_n_tokens: int = 0, prefill: list[Token] | None = None) -> Steps:
    """One step per token text; the last event carries the whole text and the details."""
    steps = []
    for index, text in enumerate(texts):
        token = Token(id=100 + index, text=text, logprob=-0.5 - index, special=False)
        top = [Token(id=200 + k, text=f"t{k}", logprob=-1.0 - k, special=False) for k in range(top_n_tokens)]
        event = StreamEvent(request_id=request_id, token=token, top_tokens=top)
        if index == len(texts) - 1:
            details = FinalDetails(finish_reason=finish_reason, generated_tokens=len(texts),
                                   input_tokens=input_tokens, seed=seed, prefill=prefill or [])
            event = dataclasses.replace(event, generated_text="".join(texts), details=details)
        steps.append([event])
    return steps


def error_steps(request_id: str, error: str, error_type: str, after_texts: list[str] = ()) -> Steps:
    """Some tokens (possibly none), then an error event."""
    steps = token_steps(request_id, list(after_texts))[:len(after_texts)]
    steps = [[dataclasses.replace(e, generated_text=None, details=None) for e in step] for step in steps]
    return steps + [[StreamEvent(request_id=request_id, error=error, error_type=error_type)]]


def default_script(generate: Generate) -> Steps:
    """` a b c ...`: max_new_tokens tokens (3 by default), with prefill and top tokens when asked."""
    parameters = generate.parameters
    num_tokens = parameters.max_new_tokens or 3
    texts = [f" {chr(ord('a') + i % 26)}" for i in range(num_tokens)]
    prefill = None
    if parameters.decoder_input_details:
        prefill = [Token(1, "<s>", float("nan"), True), Token(2, "Hi", -2.5, False)]
    return token_steps(generate.request_id, texts, input_tokens=2, seed=parameters.seed,
                       top_n_tokens=parameters.top_n_tokens or 0, prefill=prefill)


@dataclasses.dataclass
class _Playback:
    client_id: bytes
    request_id: str
    steps: Steps
    next_at: float


class ScriptedScheduler:
    """The scheduler's frontend, played by a test (see the module docstring)."""

    def __init__(self, scheduler_url: str, step_delay_s: float = 0.01, vision: bool = False) -> None:
        self.endpoints = Endpoints(scheduler_url)
        self.step_delay_s = step_delay_s
        self.vision = vision  # its Info says the model takes images
        self.boot_nonce = new_boot_nonce()
        self.script: Script = default_script
        self.health = (True, "ok")
        self.answer_queries = True
        self.generation_prompt = GENERATION_PROMPT
        self.adapter_to_path: dict[str, str] = {}
        self.busy_adapters: set[str] = set()  # adapters requests still use: unloading them is a conflict
        self.received: list[tuple[bytes, Any]] = []
        self._playbacks: list[_Playback] = []
        self._condition = threading.Condition()
        self._running = True
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scripted-scheduler", daemon=True)

    def start(self) -> ScriptedScheduler:
        self._thread.start()
        assert self._bound.wait(5), "the scripted scheduler did not bind"
        return self

    def stop(self) -> None:
        self._running = False
        self._thread.join(5)

    def restart(self) -> None:
        """Forgets every request and takes a new boot nonce, as a restarted scheduler would."""
        with self._condition:
            self.boot_nonce = new_boot_nonce()
            self._playbacks.clear()

    def reset(self) -> None:
        with self._condition:
            self.script = default_script
            self.health = (True, "ok")
            self.answer_queries = True
            self.generation_prompt = GENERATION_PROMPT
            self.adapter_to_path.clear()
            self.busy_adapters.clear()
            self.received.clear()

    def wait_for(self, predicate: Callable[[Any], bool], timeout_s: float = 5.0) -> Any:
        """The first received message matching `predicate`; fails the test after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._condition:
            while True:
                for _, msg in self.received:
                    if predicate(msg):
                        return msg
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no matching message in {timeout_s} s; got {self.received}"
                self._condition.wait(remaining)

    def messages(self, kind: type) -> list[Any]:
        with self._condition:
            return [msg for _, msg in self.received if isinstance(msg, kind)]

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        context = zmq.Context()
        socket = context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.bind(self.endpoints.bind("frontend"))
        self._bound.set()
        try:
            while self._running:
                if socket.poll(5):
                    while socket.poll(0):
                        client_id, frame = socket.recv_multipart()
                        self._on_frame(socket, client_id, decode(frame))
                self._play_due(socket)
        finally:
            context.destroy(linger=0)

    def _on_frame(self, socket: zmq.Socket, client_id: bytes, msg: Any) -> None:
        with self._condition:
            self.received.append((client_id, msg))
            self._condition.notify_all()
            match msg:
                case Hello() | Heartbeat():
                    self._send(socket, client_id, Heartbeat(self.boot_nonce))
                case Query() if self.answer_queries:
                    self._send(socket, client_id, self._reply(msg))
                case TokenizeQuery() if self.answer_queries:
                    self._send(socket, client_id, self._tokenize(msg))
                case LoadAdapter() | UnloadAdapter() if self.answer_queries:
                    self._send(socket, client_id, self._adapter_reply(msg))
                case Generate():
                    steps = self.script(msg)
                    if steps:  # no steps: a request the scheduler sits on
                        self._playbacks.append(_Playback(client_id, msg.request_id, steps, time.monotonic()))
                case Cancel():
                    self._playbacks = [p for p in self._playbacks
                                       if (p.client_id, p.request_id) != (client_id, msg.request_id)]

    def _play_due(self, socket: zmq.Socket) -> None:
        now = time.monotonic()
        with self._condition:
            for playback in list(self._playbacks):
                if playback.next_at > now:
                    continue
                self._send(socket, playback.client_id, StreamEvents(playback.steps.pop(0)))
                playback.next_at = now + self.step_delay_s
                if not playback.steps:
                    self._playbacks.remove(playback)

    @staticmethod
    def _send(socket: zmq.Socket, client_id: bytes, msg: Any) -> None:
        socket.send_multipart([client_id, encode(msg)])

    def _tokenize(self, query: TokenizeQuery) -> TokenizeReply:
        """One token: the text, or with messages a ChatML prompt ending in `generation_prompt`."""
        text = query.inputs
        if query.messages is not None:
            text = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in query.messages)
            text += self.generation_prompt
        return TokenizeReply(query.query_id, [SimpleToken(0, text, 0, len(text))])

    def _adapter_reply(self, msg: LoadAdapter | UnloadAdapter) -> AdapterReply:
        """The scheduler's answers to adapter commands, on a registry of names."""
        if isinstance(msg, LoadAdapter):
            if msg.name in self.adapter_to_path:
                return AdapterReply(msg.query_id, f"the adapter `{msg.name}` is already loaded", "conflict")
            if not os.path.isdir(msg.path):
                return AdapterReply(msg.query_id, f"`{msg.path}` is not a directory", "validation")
            self.adapter_to_path[msg.name] = msg.path
        elif msg.name not in self.adapter_to_path:
            return AdapterReply(msg.query_id, f"no adapter named `{msg.name}`", "not_found")
        elif msg.name in self.busy_adapters:
            return AdapterReply(msg.query_id, f"requests still use the adapter `{msg.name}`", "conflict")
        else:
            del self.adapter_to_path[msg.name]
        return AdapterReply(msg.query_id)

    def _reply(self, query: Query) -> Any:
        match query.kind:
            case "health":
                return HealthReply(query.query_id, *self.health)
            case "info":
                return InfoReply(
                    query_id=query.query_id, model_id="test/tiny", model_dtype="float32",
                    model_device_type="cpu", max_concurrent_requests=128, max_best_of=2,
                    max_stop_sequences=4, max_input_tokens=4095, max_total_tokens=4096,
                    max_batch_total_tokens=16384, max_batch_prefill_tokens=4096, max_waiting_tokens=20,
                    max_batch_size=None, waiting_served_ratio=0.3, num_workers=1, num_tokenizers=2,
                    version="0.1.0", lora_adapters=list(self.adapter_to_path), max_loras=4, max_lora_rank=64,
                    vision=self.vision)
            case _:
                return StatsReply(query_id=query.query_id, num_queued=0, num_running=len(self._playbacks),
                                  num_workers=1, num_tokenizers=2, worker_batch_sizes={"w0": 0},
                                  worker_requests_served={"w0": 0}, num_generated_tokens=0,
                                  num_requests_finished=0)
