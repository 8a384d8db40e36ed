"""Frames the scheduler's logic wants sent, collected per socket and flushed by the service."""

from __future__ import annotations

import dataclasses

from ztgi.common.codec import encode


@dataclasses.dataclass
class Outbox:
    """Multipart frames per socket; ROUTER sockets get the peer identity as first frame."""

    frontend: list[list[bytes]] = dataclasses.field(default_factory=list)
    tokenize: list[list[bytes]] = dataclasses.field(default_factory=list)
    detokenize: list[list[bytes]] = dataclasses.field(default_factory=list)
    workers: list[list[bytes]] = dataclasses.field(default_factory=list)

    def to_client(self, client_id: bytes, payload: bytes) -> None:
        self.frontend.append([client_id, payload])

    def to_tokenizer(self, tokenizer_id: bytes, message: object) -> None:
        self.detokenize.append([tokenizer_id, encode(message)])

    def to_worker(self, worker_id: bytes, message: object) -> None:
        self.workers.append([worker_id, encode(message)])

    def to_tokenizer_pool(self, payload: bytes) -> None:
        self.tokenize.append([payload])

    def clear(self) -> None:
        for frames in (self.frontend, self.tokenize, self.detokenize, self.workers):
            frames.clear()
