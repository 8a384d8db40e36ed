"""The tokenizers connected to the scheduler, and the detokenize jobs each has not answered yet.

Each `DetokenizeJob` (one per owning tokenizer per step) is remembered until the `TextBatch`
that answers it arrives, so that when a tokenizer is lost the scheduler knows which tokens'
text reached the client (another tokenizer replays those silently: `Adopt`) and which steps
to send again to the adopter.
"""

from __future__ import annotations

import collections
import itertools
import logging

from ztgi.common.messages import DetokenizeJob, Forget, RequestKey, TokenStep
from ztgi.services.scheduler.outbox import Outbox
from ztgi.services.scheduler.request import Request

logger = logging.getLogger(__name__)

MAX_ADOPTED_AWAY = 64  # lost tokenizers remembered for a Forget, should they come back

Steps = list[tuple[Request, TokenStep]]


class TokenizerPool:
    """Last-seen times, unanswered detokenize jobs, and the requests adopted away from each tokenizer."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.last_seen: dict[bytes, float] = {}
        # per tokenizer, the DetokenizeJobs not yet answered (one TextBatch per job, in order)
        self.unacknowledged: dict[bytes, collections.deque[tuple[int, Steps]]] = collections.defaultdict(
            collections.deque)
        self._job_ids = itertools.count(1)
        # per tokenizer lost for silence, the requests handed to others: it forgets them if it returns
        self.adopted_away: dict[bytes, list[RequestKey]] = {}

    def __len__(self) -> int:
        return len(self.last_seen)

    def __contains__(self, tokenizer_id: bytes) -> bool:
        return tokenizer_id in self.last_seen

    def identities(self) -> list[bytes]:
        return list(self.last_seen)

    def seen(self, tokenizer_id: bytes, now: float, hello: bool) -> None:
        """A message from the tokenizer: it is alive, and forgets what was adopted away from it."""
        if hello and tokenizer_id not in self.last_seen:
            logger.info("tokenizer %s registered", tokenizer_id.decode(errors="replace"))
        if tokenizer_id in self.adopted_away:  # back after a stall: its old requests are served elsewhere
            self.outbox.to_tokenizer(tokenizer_id, Forget(self.adopted_away.pop(tokenizer_id)))
        self.last_seen[tokenizer_id] = now

    def silent_since(self, deadline: float) -> list[bytes]:
        """The tokenizers last heard from before `deadline`."""
        return [tokenizer_id for tokenizer_id, seen in self.last_seen.items() if seen < deadline]

    def send_detokenize(self, tokenizer_id: bytes, steps: Steps) -> None:
        job_id = next(self._job_ids)
        self.unacknowledged[tokenizer_id].append((job_id, steps))
        self.outbox.to_tokenizer(tokenizer_id, DetokenizeJob([step for _, step in steps], job_id))

    def acknowledge(self, tokenizer_id: bytes, job_id: int) -> Steps | None:
        """The steps of the job a TextBatch answers (older unanswered jobs of that tokenizer, whose
        frames it could not read, are skipped); None for a job it no longer owns."""
        pending = self.unacknowledged.get(tokenizer_id)
        if not pending or all(pending_id != job_id for pending_id, _ in pending):
            return None
        while True:
            pending_id, steps = pending.popleft()
            if pending_id == job_id:
                return steps

    def remove(self, tokenizer_id: bytes) -> list[Steps]:
        """Forgets a lost tokenizer; the steps of its unanswered jobs, oldest first."""
        del self.last_seen[tokenizer_id]
        return [steps for _, steps in self.unacknowledged.pop(tokenizer_id, ())]

    def adopted_from(self, tokenizer_id: bytes, keys: list[RequestKey]) -> None:
        """Requests of a tokenizer lost for silence went to another: it is told if it comes back."""
        self.adopted_away[tokenizer_id] = keys
        while len(self.adopted_away) > MAX_ADOPTED_AWAY:
            del self.adopted_away[next(iter(self.adopted_away))]

    def least_busy(self) -> bytes:
        """The connected tokenizer with the fewest unanswered jobs (there must be one)."""
        return min(self.last_seen, key=lambda t: len(self.unacknowledged.get(t, ())))
