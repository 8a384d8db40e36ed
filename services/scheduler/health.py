"""Health that tells the truth: healthy only when a request can be served now.

The scheduler is healthy when it is not draining, a ready worker exists, a tokenizer is
connected, and some ready worker has made progress (answered a command) within
`health_window_s`. A heartbeat alone is not progress: a worker heartbeats from its IO thread
even while its engine is stuck. When every ready worker has been quiet for longer than the
window, the monitor asks an idle, empty one for a one-token canary (TGI's liveness prefill)
and answers the health queries waiting on it when the canary completes, fails, or has not come
back within `canary_timeout_s`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from ztgi.common.codec import encode
from ztgi.common.messages import HealthReply
from ztgi.services.scheduler.outbox import Outbox
from ztgi.services.scheduler.worker_slot import WorkerSlot

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Assessment:
    """A verdict; `quiet` when it is unhealthy only because no worker answered lately, and then
    `canary_worker` is an idle one to ask for a canary before answering."""

    healthy: bool
    reason: str
    quiet: bool = False
    canary_worker: WorkerSlot | None = None


@dataclasses.dataclass(frozen=True)
class WorkerLoss:
    """The last worker the scheduler lost: which, why, when (a 503 says it)."""

    identity: bytes
    reason: str
    lost_at: float


def assess(workers: Iterable[WorkerSlot], num_tokenizers: int, draining: bool, now: float,
           window_s: float, last_loss: WorkerLoss | None = None) -> Assessment:
    """Whether a request can be served now, from what the scheduler has seen (no IO).

    Each reason says only what is known: a worker quiet because nothing was asked of it is
    not stuck, so a stuck verdict counts from the unanswered command, not the last answer."""
    if draining:
        return Assessment(False, "shutting down")
    workers = list(workers)
    ready = [slot for slot in workers if slot.ready and not slot.draining]
    if not ready:
        num_draining = sum(slot.draining for slot in workers)
        return Assessment(False, _not_ready_reason(len(workers) - num_draining, num_draining, now, last_loss))
    if not num_tokenizers:
        return Assessment(False, "no tokenizer is connected")
    if any(now - slot.last_progress <= window_s for slot in ready):
        return Assessment(True, "ok")
    idle = [slot for slot in ready if slot.idle and not slot.batches]
    if idle:
        return Assessment(False, f"no worker answered a command in the last {window_s:g} s", True, idle[0])
    waits = [now - slot.in_flight[0].sent_at for slot in ready if slot.in_flight]
    if not waits:  # between an answer and the next command
        return Assessment(False, f"no worker answered a command in the last {window_s:g} s", True)
    return Assessment(False, f"no worker has answered its command for {min(waits):.0f} s, none answered one in "
                             f"the last {window_s:g} s (a command is stuck)", True)


def _not_ready_reason(num_warming: int, num_draining: int, now: float, last_loss: WorkerLoss | None) -> str:
    reason = "no worker is ready" + (f" ({num_warming} warming up)" if num_warming else "")
    reason += f" ({num_draining} draining to stop)" if num_draining else ""
    if last_loss is not None:
        reason += (f"; worker {last_loss.identity.decode(errors='replace')} was lost "
                   f"{now - last_loss.lost_at:.0f} s ago ({last_loss.reason})")
    return reason


@dataclasses.dataclass
class Canary:
    """A one-token canary in flight on one worker."""

    worker_id: bytes
    sent_at: float


class HealthMonitor:
    """Answers health queries: at once from `assess`, or after a canary when workers are quiet."""

    def __init__(self, outbox: Outbox, canary_timeout_s: float) -> None:
        self.outbox = outbox
        self.canary_timeout_s = canary_timeout_s
        self.canary: Canary | None = None
        self.waiting: list[tuple[bytes, str]] = []  # (client_id, query_id) waiting on the canary

    def query(self, client_id: bytes, query_id: str, assessment: Assessment, now: float) -> WorkerSlot | None:
        """Answers now, or parks the query; returns the worker to send a canary to, if one is due.

        While a canary runs, its worker is busy: a quiet verdict then waits for the canary too.
        """
        if not assessment.quiet or (assessment.canary_worker is None and self.canary is None):
            self._reply(client_id, query_id, assessment.healthy, assessment.reason)
            return None
        self.waiting.append((client_id, query_id))
        if self.canary is not None:
            return None
        worker = assessment.canary_worker
        assert worker is not None, "a quiet verdict with no canary running names a worker"
        self.canary = Canary(worker.identity, now)
        logger.info("no worker progress lately: one-token canary on %s", worker.identity.decode(errors="replace"))
        return worker

    def on_canary(self, slot: WorkerSlot, error: str | None) -> None:
        """The canary came back: healthy, or not with the worker's error."""
        self.canary = None
        name = slot.identity.decode(errors="replace")
        if error is None:
            self._answer_waiting(True, "ok")
        else:
            logger.warning("worker %s failed the health canary: %s", name, error)
            self._answer_waiting(False, f"worker {name} failed a one-token canary: {error}")

    def tick(self, now: float, worker_ids: Iterable[bytes]) -> None:
        """Gives up on a canary whose worker is gone or that took longer than `canary_timeout_s`."""
        canary = self.canary
        if canary is None:
            return
        name = canary.worker_id.decode(errors="replace")
        if canary.worker_id not in set(worker_ids):
            self.canary = None
            self._answer_waiting(False, f"worker {name} was lost during a one-token canary")
        elif now - canary.sent_at > self.canary_timeout_s:
            self.canary = None  # a late answer is still progress; the next query sends a new one
            self._answer_waiting(False, f"worker {name} did not finish a one-token canary in "
                                        f"{self.canary_timeout_s:g} s")

    def _answer_waiting(self, healthy: bool, reason: str) -> None:
        for client_id, query_id in self.waiting:
            self._reply(client_id, query_id, healthy, reason)
        self.waiting.clear()

    def _reply(self, client_id: bytes, query_id: str, healthy: bool, reason: str) -> None:
        self.outbox.to_client(client_id, encode(HealthReply(query_id, healthy, reason)))
