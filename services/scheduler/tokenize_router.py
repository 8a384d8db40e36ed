"""Routing TGI's /tokenize through the pipeline: a client's query to one tokenizer and back.

Each query becomes a `TokenizeJob` sent to the connected tokenizer with the fewest jobs
pending (on `detokenize`, so the job reaches that very tokenizer). The tokenizer answers
`TokenizeDone`, whose payload (an encoded `TokenizeReply`) goes to the client untouched.
With no tokenizer connected the client gets an `unhealthy` error at once; jobs of a lost
tokenizer go to another one, or fail when none is left.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging

from ztgi.common.codec import encode
from ztgi.common.messages import TokenizeDone, TokenizeJob, TokenizeQuery, TokenizeReply
from ztgi.services.scheduler.outbox import Outbox

logger = logging.getLogger(__name__)

NO_TOKENIZER = "No tokenizer is connected to tokenize the inputs"


@dataclasses.dataclass
class PendingJob:
    client_id: bytes
    job: TokenizeJob
    tokenizer_id: bytes


class TokenizeRouter:
    """Tokenize jobs in flight, by job id (see the module docstring)."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.pending: dict[int, PendingJob] = {}
        self._job_ids = itertools.count(1)

    def submit(self, client_id: bytes, query: TokenizeQuery, tokenizer_ids: list[bytes]) -> None:
        """Sends the query to a tokenizer, or answers the client with an error when there is none."""
        job = TokenizeJob(next(self._job_ids), query)
        if not tokenizer_ids:
            self._fail(client_id, query.query_id, NO_TOKENIZER)
            return
        self._send(PendingJob(client_id, job, self._least_busy(tokenizer_ids)))

    def on_done(self, done: TokenizeDone) -> None:
        pending = self.pending.pop(done.job_id, None)
        if pending is None:
            logger.debug("answer to tokenize job %d that is no longer pending: dropped", done.job_id)
            return
        self.outbox.to_client(pending.client_id, done.payload)

    def reroute(self, lost_tokenizer_id: bytes, tokenizer_ids: list[bytes]) -> None:
        """The jobs of a lost tokenizer go to the others, or fail when none is left."""
        lost = [p for p in self.pending.values() if p.tokenizer_id == lost_tokenizer_id]
        for pending in lost:
            if tokenizer_ids:
                self._send(dataclasses.replace(pending, tokenizer_id=self._least_busy(tokenizer_ids)))
            else:
                del self.pending[pending.job.job_id]
                self._fail(pending.client_id, pending.job.query.query_id, NO_TOKENIZER)

    def _least_busy(self, tokenizer_ids: list[bytes]) -> bytes:
        num_jobs = {tokenizer_id: 0 for tokenizer_id in tokenizer_ids}
        for pending in self.pending.values():
            if pending.tokenizer_id in num_jobs:
                num_jobs[pending.tokenizer_id] += 1
        return min(tokenizer_ids, key=num_jobs.__getitem__)

    def _send(self, pending: PendingJob) -> None:
        self.pending[pending.job.job_id] = pending
        self.outbox.to_tokenizer(pending.tokenizer_id, pending.job)

    def _fail(self, client_id: bytes, query_id: str, error: str) -> None:
        self.outbox.to_client(client_id, encode(TokenizeReply(query_id, [], error, "unhealthy")))
