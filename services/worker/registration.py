"""Whether the worker is registered with the scheduler, from the answers to its heartbeats.

The worker says Hello on its command socket and heartbeats on its liveness socket; the
scheduler answers each heartbeat with its boot nonce and whether it knows a worker of this boot
nonce. Two things make the worker register again (drop its cached batches, say Hello):

- a new scheduler nonce: the scheduler restarted and knows nothing of this worker;
- the scheduler does not know this worker: it was silent longer than the heartbeat window
  (frozen, starved of CPU, a paused VM) and was dropped, its requests requeued. Its old
  batches are useless then, and nothing would ever bring it back otherwise.

A first heartbeat may overtake the Hello (two sockets), so it takes `patience` answers in a
row that say "unknown"; after asking for a Hello (for either reason), `retry_after` more before
asking again (a Hello may wait behind a long command).
"""

from __future__ import annotations

import enum


class Rejoin(enum.Enum):
    SCHEDULER_RESTARTED = "scheduler restarted"
    UNKNOWN_TO_SCHEDULER = "the scheduler no longer knows this worker (silent past its heartbeat window)"


class Registration:
    """Reads each heartbeat answer; says when the worker must register again."""

    def __init__(self, patience: int = 2, retry_after: int = 10) -> None:
        self.patience = patience
        self.retry_after = retry_after
        self.scheduler_nonce: str | None = None
        self.num_unknown = 0  # answers in a row that did not know this worker

    def on_heartbeat(self, scheduler_nonce: str, registered: bool | None) -> Rejoin | None:
        """The reason to drop every cached batch and say Hello again, or None."""
        previous, self.scheduler_nonce = self.scheduler_nonce, scheduler_nonce
        if previous is not None and scheduler_nonce != previous:
            self.num_unknown = self.patience  # a Hello is asked for now: the next only after retry_after
            return Rejoin.SCHEDULER_RESTARTED
        if registered is not False:
            self.num_unknown = 0
            return None
        self.num_unknown += 1
        beyond = self.num_unknown - self.patience
        if beyond >= 0 and beyond % self.retry_after == 0:
            return Rejoin.UNKNOWN_TO_SCHEDULER
        return None
