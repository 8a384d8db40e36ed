"""The workers registered with the scheduler, and which of their answers are the awaited ones.

A worker registers with `Hello` (its command socket's identity) and heartbeats from a second
socket, known by its boot nonce. Each answer must be the one its oldest in-flight command
waits for, and of the type that command's kind answers with; anything else is dropped or
turned into a failure here, so the `Batcher` only sees answers it can act on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from ztgi.common.messages import CommandDone, CommandFailed, FilterResult, StepResult, WarmupResult, WorkerInfo
from ztgi.services.scheduler.worker_slot import CommandKind, InFlight, WorkerSlot

logger = logging.getLogger(__name__)

ANSWER_TYPES: dict[CommandKind, type] = {
    CommandKind.WARMUP: WarmupResult, CommandKind.PREFILL: StepResult, CommandKind.DECODE: StepResult,
    CommandKind.FILTER: FilterResult, CommandKind.CLEAR: CommandDone, CommandKind.CANARY: StepResult,
}
"""What a worker answers to each command (or CommandFailed)."""


class WorkerPool:
    """The `WorkerSlot` of every registered worker, by the identity it registered with."""

    def __init__(self) -> None:
        self._slots: dict[bytes, WorkerSlot] = {}

    def __contains__(self, identity: bytes) -> bool:
        return identity in self._slots

    def __getitem__(self, identity: bytes) -> WorkerSlot:
        return self._slots[identity]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def get(self, identity: bytes) -> WorkerSlot | None:
        return self._slots.get(identity)

    def values(self) -> list[WorkerSlot]:
        return list(self._slots.values())

    def ready(self) -> list[WorkerSlot]:
        """The workers that finished their warmup (draining ones too: they still run their requests)."""
        return [slot for slot in self._slots.values() if slot.ready]

    def serving(self) -> list[WorkerSlot]:
        """The ready workers that take new requests: not draining."""
        return [slot for slot in self._slots.values() if slot.ready and slot.drain_deadline is None]

    def add(self, identity: bytes, info: WorkerInfo, boot_nonce: str) -> WorkerSlot:
        slot = WorkerSlot(identity=identity, info=info, boot_nonce=boot_nonce)
        self._slots[identity] = slot
        logger.info("worker %s registered: %s on %s (%s)", identity.decode(errors="replace"),
                    info.model_id, info.device, info.dtype)
        return slot

    def remove(self, identity: bytes) -> WorkerSlot | None:
        return self._slots.pop(identity, None)

    def heard_from(self, identity: bytes, now: float, boot_nonce: str | None = None) -> WorkerSlot | None:
        """A worker was heard from: by the identity it registered with, or, for a heartbeat from
        its liveness socket (another identity), by its boot nonce; its slot when it is registered."""
        slot = self._slots.get(identity)
        if slot is None and boot_nonce is not None:
            slot = next((s for s in self._slots.values() if s.boot_nonce == boot_nonce), None)
        if slot is not None:
            slot.last_seen = now
        return slot

    def awaited_answer(self, identity: bytes, answer: object) -> tuple[WorkerSlot, InFlight, object] | None:
        """The worker, its oldest in-flight command (now answered) and the answer, when this is the
        answer that command awaits; a wrong answer type becomes CommandFailed. None (logged) for an
        unregistered worker or an answer to a command not in flight."""
        slot = self._slots.get(identity)
        if slot is None:
            logger.debug("answer from unregistered worker %r dropped", identity)
            return None
        in_flight = slot.in_flight[0] if slot.in_flight else None
        command_id = getattr(answer, "command_id", None)
        if in_flight is None or command_id != in_flight.command_id:
            if isinstance(answer, CommandFailed):
                logger.warning("worker %s: %s", identity.decode(errors="replace"), answer.error)
            else:
                logger.warning("worker %r answered command %s, expected %s; dropped", identity, command_id,
                               in_flight.command_id if in_flight else None)
            return None
        slot.in_flight.popleft()
        if slot.in_flight:  # a pipelined command starts now: its round trip counts from here
            slot.in_flight[0].sent_at = max(slot.in_flight[0].sent_at, time.monotonic())
        if not isinstance(answer, (CommandFailed, ANSWER_TYPES[in_flight.kind])):
            # a broken or hostile worker: the command failed, whatever the answer says
            error = f"answered {in_flight.kind.value} with {type(answer).__name__}"
            logger.warning("worker %r %s", identity, error)
            answer = CommandFailed(in_flight.command_id, error, [])
        if not isinstance(answer, CommandFailed):
            slot.last_progress = time.monotonic()
        return slot, in_flight, answer
