"""The tokenizer process: encode jobs in, encoded requests out; token steps in, text out."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import zmq
from transformers import PreTrainedTokenizerBase

from ztgi.common import curve, handshake
from ztgi.common.codec import MAX_MESSAGE_BYTES, MessageError, decode_frames, encode
from ztgi.common.config import parse_config
from ztgi.common.identity import new_boot_nonce, new_identity
from ztgi.common.lifecycle import on_stop_signals, serve
from ztgi.common.logs import setup_logging
from ztgi.common.messages import (
    PROTOCOL_VERSION,
    Adopt,
    DetokenizeJob,
    Encoded,
    EncodeJob,
    Forget,
    Heartbeat,
    Hello,
    Rejected,
    TokenizeDone,
    TokenizeJob,
    TokenizeReply,
)
from ztgi.common.model_source import ModelNotFoundError
from ztgi.common.parameters import ValidationError
from ztgi.common.ready_file import ReadyFile
from ztgi.services.tokenizer.config import TokenizerConfig
from ztgi.services.tokenizer.detokenizer import Detokenizer
from ztgi.services.tokenizer.encoder import Encoder
from ztgi.services.tokenizer.loading import load_tokenizer, load_vision_processor
from ztgi.services.tokenizer.vision_processor import VisionProcessor

logger = logging.getLogger(__name__)

MAX_MESSAGES_PER_PASS = 64
MAX_WAIT_MS = 100  # how late a stop signal may be noticed
SCHEDULER_MESSAGES = (Heartbeat, DetokenizeJob, Forget, Adopt, TokenizeJob)


class TokenizerService:
    """Sockets and the loop: wait for a frame or the next heartbeat, drain (detokenize first:
    it is on every stream's critical path), answer each message, heartbeat when due."""

    def __init__(self, config: TokenizerConfig, tokenizer: PreTrainedTokenizerBase,
                 stop_requested: threading.Event, vision: VisionProcessor | None = None) -> None:
        self.config = config
        self.stop_requested = stop_requested
        self.identity = new_identity("tokenizer")
        self.boot_nonce = new_boot_nonce()
        self.scheduler_nonce: str | None = None
        self.encoder = Encoder(tokenizer, config.limits, self.identity, vision, config.model_id)
        self.detokenizer = Detokenizer(tokenizer)
        self.context = zmq.Context()
        self.curve_keys = config.curve_keys
        endpoints = config.endpoints
        self.tokenize = self._connect(zmq.PULL, endpoints.connect("tokenize"))
        self.tokenized = self._connect(zmq.PUSH, endpoints.connect("tokenized"))
        self.detokenize = self._connect(zmq.DEALER, endpoints.connect("detokenize"), self.identity, watched=True)
        self.handshake = handshake.HandshakeWatch(self.curve_keys is not None, config.handshake_timeout_s)
        self.poller = zmq.Poller()
        self.poller.register(self.detokenize, zmq.POLLIN)
        self.poller.register(self.tokenize, zmq.POLLIN)
        self.poller.register(self.link_monitor, zmq.POLLIN)
        self.exit_code = 0
        self.ready_file = ReadyFile(config.ready_file)
        self.ready_file.clear()  # one left by an earlier process in the same pod says nothing of this one

    def _connect(self, kind: int, address: str, identity: bytes | None = None, watched: bool = False) -> zmq.Socket:
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # libzmq drops a larger frame unread
        curve.apply(socket, self.curve_keys)
        if identity is not None:
            socket.setsockopt(zmq.IDENTITY, identity)
        if watched:  # one link says for all three whether the keys are right
            self.link_monitor = handshake.watch(socket)
        socket.connect(address)
        return socket

    def run(self) -> None:
        """The loop, until a stop signal."""
        logger.info("tokenizer %s connected to %s", self.identity.decode(), self.config.scheduler_url)
        self._send(self.detokenize, self._hello())
        interval_s = self.config.heartbeat_interval_ms / 1000.0
        next_heartbeat = time.monotonic() + interval_s
        while not self.stop_requested.is_set():
            wait_ms = min(MAX_WAIT_MS, max(0, int((next_heartbeat - time.monotonic()) * 1000)))
            ready = dict(self.poller.poll(wait_ms))
            if self.detokenize in ready:
                for frames in self._receive(self.detokenize):
                    self.on_scheduler_frames(frames)
            if self.tokenize in ready:
                for frames in self._receive(self.tokenize):
                    self.on_encode_frames(frames)
            if self.link_monitor in ready:
                for failure in handshake.read_events(self.link_monitor, self.handshake):
                    logger.error("cannot connect to the scheduler: %s", failure)
            if time.monotonic() >= next_heartbeat:
                self._send(self.detokenize, Heartbeat(self.boot_nonce))
                next_heartbeat = time.monotonic() + interval_s
                if self.handshake.expired:
                    logger.error("no handshake with the scheduler for %g s (%s): exiting",
                                 self.config.handshake_timeout_s, self.handshake.failure)
                    self.exit_code = 1
                    break
        logger.info("stopping with %d requests in flight", self.detokenizer.num_requests)

    # -- encode --------------------------------------------------------------------------------

    def on_encode_frames(self, frames: list[bytes]) -> None:
        """An EncodeJob: answered with Encoded or Rejected on `tokenized`."""
        job = self._decode(frames, EncodeJob, "tokenize")
        if job is not None:
            self._send(self.tokenized, self.encode(job))

    def encode(self, job: EncodeJob) -> Encoded | Rejected:
        try:
            encoded = self.encoder.encode(job.key, job.generate)
        except ValidationError as exc:
            logger.debug("rejected %r: %s", job.key, exc)
            return Rejected(job.key, str(exc), "validation")
        except Exception as exc:  # a bug must cost one request, not the service
            logger.exception("encoding %r failed", job.key)
            return Rejected(job.key, f"encoding failed: {exc}", "validation")
        self.detokenizer.start(encoded, job.generate.parameters, job.scheduler_nonce)
        logger.debug("encoded %r: %d input tokens", job.key, len(encoded.input_ids))
        return encoded

    def tokenize_text(self, job: TokenizeJob) -> TokenizeDone:
        """TGI's /tokenize for one query (or vLLM's /detokenize for a query of `ids`): the tokens
        or the text, or the error, for the asking client."""
        query_id = job.query.query_id
        try:
            if job.query.ids is not None:
                reply = TokenizeReply(query_id, [], text=self.encoder.detokenize(job.query.ids))
            else:
                reply = TokenizeReply(query_id, self.encoder.tokenize(job.query))
        except ValidationError as exc:
            reply = TokenizeReply(query_id, [], str(exc), "validation")
        except Exception as exc:  # a bug must cost one query, not the service
            logger.exception("tokenizing for query %s failed", query_id)
            reply = TokenizeReply(query_id, [], f"tokenization failed: {exc}", "validation")
        return TokenizeDone(job.job_id, encode(reply))

    # -- scheduler link ------------------------------------------------------------------------

    def on_scheduler_frames(self, frames: list[bytes]) -> None:
        """Heartbeat, DetokenizeJob (answered with exactly one TextBatch) or Forget."""
        msg = self._decode(frames, SCHEDULER_MESSAGES, "detokenize")
        match msg:
            case Heartbeat():
                self._on_heartbeat(msg.boot_nonce)
            case DetokenizeJob():
                self._send(self.detokenize, self.detokenizer.detokenize(msg))
            case Forget():
                self.detokenizer.forget(msg.keys)
            case Adopt():
                self._adopt(msg)
            case TokenizeJob():
                self._send(self.detokenize, self.tokenize_text(msg))

    def _adopt(self, adopt: Adopt) -> None:
        try:
            self.detokenizer.adopt(adopt, self.scheduler_nonce or "")
        except Exception as exc:  # e.g. ids no vocabulary has: the request is lost, not the tokenizer
            logger.warning("dropped an Adopt for %r: %s: %s", adopt.encoded.key, type(exc).__name__, exc)

    def _on_heartbeat(self, scheduler_nonce: str) -> None:
        if self.scheduler_nonce is not None and scheduler_nonce != self.scheduler_nonce:
            num_dropped = self.detokenizer.keep_only(scheduler_nonce)
            logger.info("scheduler restarted: dropped %d requests of the previous one; registering again",
                        num_dropped)
            self._send(self.detokenize, self._hello())
        self.scheduler_nonce = scheduler_nonce
        self.ready_file.mark_ready()  # the scheduler answers only what it counts (any message registers)

    def _hello(self) -> Hello:
        return Hello(role="tokenizer", protocol_version=PROTOCOL_VERSION, boot_nonce=self.boot_nonce)

    # -- frames --------------------------------------------------------------------------------

    def _receive(self, socket: zmq.Socket) -> list[list[bytes]]:
        """Up to MAX_MESSAGES_PER_PASS messages without blocking."""
        messages = []
        for _ in range(MAX_MESSAGES_PER_PASS):
            try:
                messages.append(socket.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
        return messages

    def _decode(self, frames: list[bytes], expected: type | tuple[type, ...], where: str) -> Any:
        """The message in a one-frame message, or None (logged) when it is malformed."""
        try:
            return decode_frames(frames, expected)
        except MessageError as exc:
            logger.warning("dropped a bad frame on %s: %s", where, exc)
            return None

    def _send(self, socket: zmq.Socket, msg: object) -> None:
        try:
            socket.send(encode(msg), zmq.NOBLOCK)
        except zmq.Again:  # the scheduler is gone long enough to fill the queue
            logger.warning("send queue full: a %s was dropped", type(msg).__name__)

    def close(self) -> None:
        self.ready_file.clear()
        self.context.destroy(linger=0)


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(TokenizerConfig, argv, prog="ztgi tokenizer")
    setup_logging(f"tokenizer[{config.tokenizer_index}]", config.log_level, config.log_rate_limit_s)
    stop_requested = threading.Event()
    on_stop_signals(stop_requested.set)
    try:
        tokenizer = load_tokenizer(config.model_id)
        vision = load_vision_processor(config.model_id, tokenizer, config.max_image_pixels)
    except ModelNotFoundError as exc:
        logger.error("%s", exc)
        return 1
    service = TokenizerService(config, tokenizer, stop_requested, vision)
    serve(service)
    return service.exit_code
