"""A draft model's proposals for speculative decoding (`--draft-model-id`).

A small model with the target's tokenizer runs in the worker beside it, with a paged KV pool of
its own indexed by the SAME block tables (same block size and number of blocks; its own layers
and head shape): the blocks the scheduler gives a request and its proposals hold the draft's keys
too, so nothing about placement changes. `Sequence.num_draft_computed` counts the tokens whose
keys the draft has. Before a step the draft catches up, in one forward, on what it has not seen:
each prefilling sequence up to the end of the chunk the target runs this step, each proposing
sequence up to its last token (after a step that accepted proposals, one or two tokens). That
forward's last position of a proposing sequence gives its first proposal; N - 1 one-token
forwards over the proposing rows give the rest. The draft picks greedily (argmax), so it is a
deterministic proposer and the Speculator's acceptance rule stays exact, for greedy and sampling
requests alike. A fed proposal's keys are written at its position: those the target accepts are
the draft's keys of those tokens, the rest are overwritten later, as the target's are.

A step that does not speculate (a large batch) skips the draft, which catches up when the
sequence next proposes, at most MAX_CATCH_UP_TOKENS a step (a sequence still behind proposes
nothing meanwhile). A new sequence starts from its first token even when the scheduler found its
prefix cached: the shared blocks hold the target's keys of that prefix, the draft's only if the
draft happened to run over them. A stale draft key costs acceptance, never output: the target
verifies every proposal.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from ztgi.services.worker.layers.attention import AttentionInputs, PrefillSpan, decode_groups
from ztgi.services.worker.layers.host_copy import to_device
from ztgi.services.worker.layers.kv_pool import KVPool, KVShape
from ztgi.services.worker.models.families import paged_forward
from ztgi.services.worker.models.loading import LoadedModel
from ztgi.services.worker.paged.batch import PagedBatch, Sequence

if TYPE_CHECKING:
    from ztgi.services.worker.layers.quantization.factory import LayerFactory

MAX_CATCH_UP_TOKENS = 2048  # draft tokens of one step's catch-up forward, in all


@dataclasses.dataclass(frozen=True)
class CatchUp:
    """The draft runs `sequence`'s tokens `[start, start + count)`, then proposes `num_proposed`."""

    sequence: Sequence
    start: int
    count: int
    num_proposed: int


class DraftProposer:
    """The draft model, its KV pool, and the proposals of one step."""

    def __init__(self, loaded: LoadedModel, block_size: int, linear: LayerFactory | None = None) -> None:
        self.loaded = loaded
        self.device = loaded.device
        self.kv_shape = KVShape(loaded.num_layers, block_size, loaded.num_kv_heads, loaded.head_dim, loaded.dtype)
        with torch.inference_mode():
            self.forward_pass = paged_forward(loaded.module, linear)
        self.pool: KVPool | None = None

    @property
    def block_size(self) -> int:
        return self.kv_shape.block_size

    def allocate_pool(self, num_blocks: int) -> None:
        self.pool = None  # the old pool's memory goes first
        self.pool = KVPool(self.kv_shape, num_blocks, self.device)

    @torch.inference_mode()
    def propose(self, batch: PagedBatch, asks: list[tuple[Sequence, int]], budget: int) -> None:
        plan = self._plan(batch, asks, budget)
        if not plan:
            return
        assert self.pool is not None, "the draft pool is allocated with the target's"
        for entry in plan:
            self.pool.prepare(entry.sequence.block_ids)
        proposing = [entry for entry in plan if entry.num_proposed]
        drafts = [[token_id] for token_id in self._catch_up(plan)]
        for round_ in range(1, max((entry.num_proposed for entry in proposing), default=0)):
            rows = [i for i, entry in enumerate(proposing) if entry.num_proposed > round_]
            next_ids = self._decode([proposing[i].sequence for i in rows], [drafts[i][-1] for i in rows], round_)
            for i, token_id in zip(rows, next_ids):
                drafts[i].append(token_id)
        for entry, draft in zip(proposing, drafts):
            entry.sequence.draft = draft

    def settle(self, sequence: Sequence, num_accepted: int) -> None:
        """The fed proposals the target accepted are the draft's keys of those tokens."""
        sequence.num_draft_computed += min(num_accepted, len(sequence.draft) - 1)

    # -- the plan ------------------------------------------------------------------------------

    def _plan(self, batch: PagedBatch, asks: list[tuple[Sequence, int]], budget: int) -> list[CatchUp]:
        """The asked sequences first (each catches up to its last token, then proposes), then the
        prefilling ones (up to the end of this step's chunk), within MAX_CATCH_UP_TOKENS."""
        plan: list[CatchUp] = []
        left, limit = MAX_CATCH_UP_TOKENS, self.loaded.max_position_embeddings
        for sequence, count in asks:
            length = len(sequence.tokens)
            count = min(count, budget, limit + 1 - length)  # the fed proposals stay within the draft's positions
            start = min(sequence.num_draft_computed, length - 1)  # the last token always runs: its logits propose
            run = min(length - start, left)
            if count < 1 or run < 1:
                continue
            num_proposed = count if start + run == length else 0
            plan.append(CatchUp(sequence, start, run, num_proposed))
            left, budget = left - run, budget - num_proposed
        for sequence in batch.sequences:
            if not sequence.is_prefilling or sequence.stopping.stopped or sequence.request.sampling.grammar:
                continue
            chunk_start, chunk_len = sequence.next_span()
            run = min(chunk_start + chunk_len, limit) - sequence.num_draft_computed
            if min(run, left) > 0:
                plan.append(CatchUp(sequence, sequence.num_draft_computed, min(run, left), 0))
                left -= min(run, left)
        return plan

    # -- the forwards --------------------------------------------------------------------------

    def _catch_up(self, plan: list[CatchUp]) -> list[int]:
        """Runs every entry's tokens as a prefill span; the first proposal of each proposing one."""
        spans, logit_rows, row = [], [], 0
        for entry in plan:
            table = _table(entry.sequence.block_ids, entry.start + entry.count, self.block_size)
            spans.append(PrefillSpan(row, row + entry.count, entry.start, to_device(table, self.device)))
            row += entry.count
            if entry.num_proposed:
                logit_rows.append(row - 1)
            entry.sequence.num_draft_computed = entry.start + entry.count
        input_ids = [t for entry in plan for t in entry.sequence.tokens[entry.start:entry.start + entry.count]]
        positions = torch.cat([torch.arange(entry.start, entry.start + entry.count) for entry in plan])
        slots = torch.cat([_slots(entry.sequence.block_ids, entry.start, entry.count, self.block_size)
                           for entry in plan])
        attention = AttentionInputs(to_device(slots, self.device), [], spans)
        return self._argmax(input_ids, positions, attention, logit_rows or [row - 1])[:len(logit_rows)]

    def _decode(self, sequences: list[Sequence], input_ids: list[int], round_: int) -> list[int]:
        """Feeds each sequence its last proposal (after its `len(tokens) + round_ - 1` tokens); the next ones."""
        positions = [len(sequence.tokens) + round_ - 1 for sequence in sequences]
        tables = [sequence.block_ids[:position // self.block_size + 1]
                  for sequence, position in zip(sequences, positions)]
        groups = decode_groups(tables, [position + 1 for position in positions], self.block_size, self.device)
        slots = torch.cat([_slots(sequence.block_ids, position, 1, self.block_size)
                           for sequence, position in zip(sequences, positions)])
        attention = AttentionInputs(to_device(slots, self.device), groups, [])
        return self._argmax(input_ids, torch.tensor(positions), attention, list(range(len(sequences))))

    def _argmax(self, input_ids: list[int], positions: torch.Tensor, attention: AttentionInputs,
                logit_rows: list[int]) -> list[int]:
        assert self.pool is not None
        logits = self.forward_pass(to_device(torch.tensor(input_ids, dtype=torch.int64), self.device),
                                   to_device(positions, self.device), attention, self.pool,
                                   to_device(torch.tensor(logit_rows, dtype=torch.int64), self.device))
        return logits.argmax(-1).tolist()


def _table(block_ids: list[int], num_tokens: int, block_size: int) -> torch.Tensor:
    return torch.tensor(block_ids[:-(-num_tokens // block_size)], dtype=torch.int64)


def _slots(block_ids: list[int], start: int, count: int, block_size: int) -> torch.Tensor:
    positions = torch.arange(start, start + count)
    return _table(block_ids, start + count, block_size)[positions // block_size] * block_size + positions % block_size
