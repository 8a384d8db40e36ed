"""Speculative decoding on the paged engine: propose, verify in the step's one forward, accept.

Before a step each decoding sequence may get a draft from the proposer: prompt lookup (what followed
its last tokens earlier in its prompt and output, `prompt_lookup.py`) or a draft model
(`draft_proposer.py`, `--draft-model-id`); both propose deterministically, given the tokens. The
step feeds the last chosen token and the draft like a prefill chunk, so every position has logits.
The chooser then runs over one row per position, as if the draft had been accepted up to there
(penalties see that history), and the draft is accepted while it agrees with the chosen tokens; the
first disagreement is itself the next token, and when all agree the last position gives one more. A
greedy request thus gets exactly the tokens it gets without speculation. A sampling request draws
each position's token from its own generator as it would one step at a time (the exponential race
over the processed distribution): a proposed token x is accepted with probability p(x), and on
rejection the token is drawn from p with x removed, renormalised, which is rejection sampling for a
deterministic proposer, so the target distribution is kept. The generator is then set to where it
would be after the emitted tokens alone, so a seeded request gives the same tokens with or without
speculation, whatever shares its batch. Grammar-constrained requests do not speculate.

Back-off: proposals cost compute in the verifying forward, and pay only while a step's cost is
its weights' read rather than its tokens' arithmetic. So a step proposes nothing when more than
MAX_SPECULATING_ROWS sequences decode (the batch already fills the forward; a verified draft
also leaves the grouped decode attention for an attention call of its own), proposes at most
MAX_PROPOSED_TOKENS tokens in all, to the sequences whose recent proposals were accepted most
first, and a sequence whose proposals were mostly rejected lately pauses for a few steps before
it tries again.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from ztgi.services.worker.paged.batch import PagedBatch, Sequence, histories
from ztgi.services.worker.sampling.generations import step_rows

MAX_SPECULATING_ROWS = 8  # above this many decoding sequences a step is compute-bound: no proposals
MAX_PROPOSED_TOKENS = 16  # proposals of one step, in all
MIN_ACCEPTANCE = 0.2  # a sequence whose recent proposals were accepted less than this pauses...
RECOVERY_PER_STEP = 0.02  # ...until this much a step brings it back to try again


@dataclasses.dataclass
class StepCounts:
    """Proposed and accepted tokens of one step."""

    num_proposed: int = 0
    num_accepted: int = 0


class Proposer(Protocol):
    """Where a step's drafts come from."""

    def propose(self, batch: PagedBatch, asks: list[tuple[Sequence, int]], budget: int) -> None:
        """Sets the draft of each asked sequence (in the order given, best first), at most its count
        of tokens and `budget` tokens in all; may also prepare for later steps (a draft model runs
        over the batch's prefill chunks)."""

    def settle(self, sequence: Sequence, num_accepted: int) -> None:
        """After the step: `num_accepted` of the sequence's draft (still set) were accepted."""


class PromptLookupProposer:
    """Proposals from each sequence's own n-gram index (`Sequence.lookup`)."""

    def propose(self, batch: PagedBatch, asks: list[tuple[Sequence, int]], budget: int) -> None:
        for sequence, count in asks:
            sequence.draft = sequence.lookup.propose(sequence.tokens, min(count, budget))
            budget -= len(sequence.draft)

    def settle(self, sequence: Sequence, num_accepted: int) -> None:
        pass


class Speculator:
    """Makes each step's drafts and turns the verifying rows into accepted tokens."""

    def __init__(self, num_speculative: int, block_size: int, proposer: Proposer | None = None) -> None:
        if num_speculative < 0:
            raise ValueError(f"--speculate must be >= 0, got {num_speculative}")
        self.num_speculative = num_speculative
        self.block_size = block_size
        self.proposer: Proposer = proposer if proposer is not None else PromptLookupProposer()
        self.counts = StepCounts()
        self._rewind: dict[int, torch.Tensor] = {}  # sequence -> its generator's state before the step
        self._vocab_size = 0

    # -- proposals -----------------------------------------------------------------------------

    def propose(self, batch: PagedBatch) -> None:
        """Sets every sequence's draft for the next step (none where speculation does not pay)."""
        self.counts = StepCounts()
        decoding = [s for s in batch.sequences if not s.is_prefilling and not s.stopping.stopped]
        for sequence in batch.sequences:
            sequence.draft = []
        if len(decoding) > MAX_SPECULATING_ROWS:
            return
        asks = [(sequence, self._draft_len(sequence)) for sequence in sorted(decoding, key=lambda s: -s.acceptance)]
        self.proposer.propose(batch, [(sequence, count) for sequence, count in asks if count > 0],
                              MAX_PROPOSED_TOKENS)
        self.counts.num_proposed = sum(len(sequence.draft) for sequence in decoding)

    def _draft_len(self, sequence: Sequence) -> int:
        """How many tokens the sequence may propose: within its blocks and its remaining tokens."""
        request = sequence.request
        if request.sampling.grammar is not None:
            return 0
        room = sequence.capacity(self.block_size) - len(sequence.tokens)
        if sequence.acceptance < MIN_ACCEPTANCE:
            sequence.acceptance += RECOVERY_PER_STEP
            return 0
        return min(self.num_speculative, sequence.stopping.num_remaining - 1, room)

    # -- verification --------------------------------------------------------------------------

    def choose(self, batch: PagedBatch, sampled: list[int], sample_logits: list[int],
               logits: torch.Tensor) -> list[list[list[float]]]:
        """The chosen token rows at every position of each sampled sequence (one for a sequence
        without a draft); each sampling sequence's generator is left where its first position's
        draw left it, and `settle` moves it on."""
        widths = [1 + len(batch.sequences[i].draft) for i in sampled]
        expanded = [i for i, width in zip(sampled, widths) for _ in range(width)]
        positions = [first + k for first, width in zip(sample_logits, widths) for k in range(width)]
        chooser = batch.chooser.select(expanded)
        history: tuple[torch.Tensor, ...] = ()
        if chooser.needs_history:
            history = histories([batch.sequences[i].tokens + batch.sequences[i].draft[:k]
                                 for i, width in zip(sampled, widths) for k in range(width)], chooser.device)
        states = {}
        for i in sampled:
            generator = batch.chooser.generators[i]
            if generator is not None and batch.sequences[i].draft:
                states[i] = generator.get_state()
        scores = logits.index_select(0, torch.tensor(positions, device=logits.device))
        next_ids, logprobs = chooser(scores, *history)
        rows = step_rows(next_ids, logprobs, [batch.sequences[i].request.top_n_tokens for i in expanded])
        self._rewind, self._vocab_size = states, scores.shape[-1]
        out, at = [], 0
        for width in widths:
            out.append(rows[at:at + width])
            at += width
        return out

    def settle(self, batch: PagedBatch, index: int, num_emitted: int) -> None:
        """After a drafted sequence emitted `num_emitted` tokens: its KV is valid up to its last
        accepted token, its generator has drawn once per emitted token, its draft is spent."""
        sequence = batch.sequences[index]
        num_accepted = min(num_emitted, len(sequence.draft) + 1) - 1
        self.counts.num_accepted += num_accepted
        self.proposer.settle(sequence, num_accepted)
        sequence.acceptance = 0.5 * sequence.acceptance + 0.5 * num_accepted / len(sequence.draft)
        sequence.num_computed = len(sequence.tokens) - 1
        state = self._rewind.pop(index, None)
        if state is not None:
            generator = batch.chooser.generators[index]
            assert generator is not None, "a state was kept only for a sequence with a generator"
            generator.set_state(state)
            for _ in range(num_emitted):  # the draws of the emitted positions, as one step at a time makes them
                torch.empty(self._vocab_size, dtype=torch.float32, device=generator.device).exponential_(
                    generator=generator)
        sequence.draft = []

    @staticmethod
    def accepted(draft: list[int], token_ids: list[int]) -> int:
        """How many of the chosen tokens are emitted: up to and including the first that differs
        from the draft (all of them when the whole draft agrees)."""
        for k, token_id in enumerate(draft):
            if token_ids[k] != token_id:
                return k + 1
        return len(draft) + 1
