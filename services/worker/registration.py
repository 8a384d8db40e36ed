"""Whether the worker is registered with the scheduler, from the answers to its heartbeats.

The worker says Hello on its command socket and heartbeats on its liveness socket; the
scheduler answers each heartbeat with its boot nonce and whether it knows a worker of this boot
nonce. Two things make the worker register again (drop its cached batches, say Hello):

- a new scheduler nonce: the scheduler restarted and knows nothing of this worker;
- the scheduler does not know this worker: it was silent longer than the heartbeat window
  (frozen, starved of CPU, a paused VM, a network link down) and was dropped, its requests
  requeued. Its old batches are useless then, and nothing would ever bring it back otherwise.

A first heartbeat may overtake the Hello (two sockets), so it takes `patience` answers in a
row that say "unknown"; after asking for a Hello (for either reason), it asks again only once
`retry_after_s` has passed (a Hello may wait behind a long command). That wait is a time, not a
number of answers: when a cut link comes back, the heartbeats queued behind it are answered all
at once, each with "unknown", and counted answers would ask for a Hello several times over, each
one a registration and a warmup more.
"""

from __future__ import annotations

import enum


class Rejoin(enum.Enum):
    SCHEDULER_RESTARTED = "scheduler restarted"
    UNKNOWN_TO_SCHEDULER = "the scheduler no longer knows this worker (silent past its heartbeat window)"


class Registration:
    """Reads each heartbeat answer; says when the worker must register again."""

    def __init__(self, retry_after_s: float, patience: int = 2) -> None:
        self.retry_after_s = retry_after_s
        self.patience = patience
        self.scheduler_nonce: str | None = None
        self.num_unknown = 0  # answers in a row that did not know this worker
        self.asked_at: float | None = None  # when a Hello was last asked for, until an answer knows the worker

    def on_heartbeat(self, scheduler_nonce: str, registered: bool | None, now: float) -> Rejoin | None:
        """The reason to drop every cached batch and say Hello again, or None; `now` in seconds."""
        previous, self.scheduler_nonce = self.scheduler_nonce, scheduler_nonce
        if previous is not None and scheduler_nonce != previous:
            self.asked_at = now
            return Rejoin.SCHEDULER_RESTARTED
        if registered is not False:
            self.num_unknown, self.asked_at = 0, None
            return None
        self.num_unknown += 1
        if self.num_unknown < self.patience:
            return None
        if self.asked_at is not None and now - self.asked_at < self.retry_after_s:
            return None
        self.asked_at = now
        return Rejoin.UNKNOWN_TO_SCHEDULER
