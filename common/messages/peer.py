"""Registration and liveness on ROUTER/DEALER links (both directions)."""

from __future__ import annotations

from typing import Literal

from ztgi.common.codec import message
from ztgi.common.messages.batches import WorkerInfo

__all__ = ["Hello", "Heartbeat", "Role"]

Role = Literal["worker", "tokenizer", "client"]


@message("hello")
class Hello:
    """A DEALER's first message; sent again when it sees a new scheduler boot nonce."""

    role: Role
    protocol_version: int
    boot_nonce: str
    worker: WorkerInfo | None = None


@message("heartbeat")
class Heartbeat:
    """Sent periodically by every peer; the scheduler answers with its own boot nonce.

    In the scheduler's answer to a worker, `registered` says whether a worker of that boot
    nonce is registered: False tells a worker the scheduler dropped to say Hello again.

    A worker told to stop drains: its heartbeats carry `drain_s_left`, the seconds left of its
    grace period, and the scheduler admits nothing more to it; `drained` in the answer says no
    request runs on it any longer and no command is on its way: it may exit.
    """

    boot_nonce: str
    registered: bool | None = None
    drain_s_left: float | None = None
    drained: bool = False
