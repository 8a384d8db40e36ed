"""Per-request next-token choice for a whole batch (TGI's HeterogeneousNextTokenChooser).

Order, as TGI: watermark, repetition penalty, frequency penalty (then OpenAI's presence penalty
and logit bias, which TGI lacks), the grammar's mask, then temperature, top_k, top_p, typical_p. A processor runs
only when some row needs it, and then on every row at once with that row's own parameter (neutral
for the others).
Rows choose by argmax unless they sample; a sampling row draws from its own `torch.Generator`,
seeded with the request's seed, so its tokens do not depend on which other requests share the
batch. The logprob reported for a token is the log-softmax of the processed scores.

A constrained row has its own grammar state (`grammar.GrammarState`), kept in a per-row list
that `select` and `concatenate` carry like the generators; it takes each chosen token at the end
of `__call__`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ztgi.common.messages import SamplingParameters
from ztgi.services.worker.sampling import grammar as grammars
from ztgi.services.worker.sampling import logits_processors as processors
from ztgi.services.worker.sampling import watermark

MAX_SEED = 2**64 - 1


def validate_sampling(params: SamplingParameters) -> None:
    """Raises ValueError naming the first field out of range."""
    _require(math.isfinite(params.temperature), "temperature", "must be finite", params.temperature)
    if params.do_sample:
        _require(params.temperature > 0, "temperature", "must be strictly positive when sampling",
                 params.temperature)
    _require(params.top_k >= 0, "top_k", "must be >= 0 (0 disables it)", params.top_k)
    _require(0 < params.top_p <= 1, "top_p", "must be > 0 and <= 1", params.top_p)
    _require(0 < params.typical_p <= 1, "typical_p", "must be > 0 and <= 1", params.typical_p)
    _require(math.isfinite(params.repetition_penalty) and params.repetition_penalty > 0,
             "repetition_penalty", "must be strictly positive", params.repetition_penalty)
    _require(-2 <= params.frequency_penalty <= 2, "frequency_penalty", "must be >= -2 and <= 2",
             params.frequency_penalty)
    _require(-2 <= params.presence_penalty <= 2, "presence_penalty", "must be >= -2 and <= 2",
             params.presence_penalty)
    _require(0 <= params.seed <= MAX_SEED, "seed", f"must be >= 0 and <= {MAX_SEED}", params.seed)
    for entry in params.logit_bias or ():
        _require(entry.token_id >= 0 and math.isfinite(entry.bias) and abs(entry.bias) <= 100, "logit_bias",
                 "must map token ids >= 0 to values >= -100 and <= 100", entry)


def _require(condition: bool, field: str, rule: str, value: object) -> None:
    if not condition:
        raise ValueError(f"`{field}` {rule}, got {value!r}")


class NextTokenChooser:
    """The sampling state of a batch: per-row parameter columns and one generator per sampling row."""

    def __init__(self, params: Sequence[SamplingParameters], device: torch.device,
                 generators: Sequence[torch.Generator | None] | None = None,
                 grammar_states: Sequence[grammars.GrammarState | None] | None = None) -> None:
        self.params = list(params)
        self.device = device
        self.generators = list(generators) if generators is not None else [
            _seeded_generator(p.seed, device) if p.do_sample else None for p in self.params]
        self.grammar_states = list(grammar_states) if grammar_states is not None else (
            grammars.new_states([p.grammar for p in self.params]) if any(p.grammar for p in self.params)
            else [None] * len(self.params))
        self.grammar_rows = [i for i, state in enumerate(self.grammar_states) if state is not None]
        self.sample_rows = [i for i, p in enumerate(self.params) if p.do_sample]
        self.watermark_rows = [i for i, p in enumerate(self.params) if p.watermark]
        self.repetition_penalty = self._column("repetition_penalty", 1.0)
        self.frequency_penalty = self._column("frequency_penalty", 0.0)
        self.presence_penalty = self._column("presence_penalty", 0.0)
        # a greedy row ignores its temperature: it may be 0, which means greedy to many clients
        temperatures = [p.temperature if p.do_sample else 1.0 for p in self.params]
        self.temperature = self._tensor(temperatures, 1.0, torch.float32)
        self.top_k = self._column("top_k", 0, torch.int64)
        self.max_top_k = max(p.top_k for p in self.params)
        self.top_p = self._column("top_p", 1.0)
        self.typical_p = self._column("typical_p", 1.0)
        self.logit_bias = self._logit_bias()

    @classmethod
    def from_params(cls, params: Sequence[SamplingParameters], device: torch.device) -> NextTokenChooser:
        """Validates every request's parameters first (ValueError naming the field)."""
        for p in params:
            validate_sampling(p)
        return cls(params, device)

    def _column(self, name: str, neutral: float, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
        return self._tensor([getattr(p, name) for p in self.params], neutral, dtype)

    def _tensor(self, values: list, neutral: float, dtype: torch.dtype) -> torch.Tensor | None:
        """A [batch, 1] column, or None when every row is neutral (the processor is skipped)."""
        if all(v == neutral for v in values):
            return None
        return torch.tensor(values, dtype=dtype, device=self.device).unsqueeze(1)

    def _logit_bias(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(rows, token ids, biases) of every row's `logit_bias`, or None when no row has one."""
        entries = [(row, entry.token_id, entry.bias) for row, p in enumerate(self.params)
                   for entry in p.logit_bias or ()]
        if not entries:
            return None
        rows, token_ids, biases = zip(*entries)
        return (torch.tensor(rows, device=self.device), torch.tensor(token_ids, device=self.device),
                torch.tensor(biases, dtype=torch.float32, device=self.device))

    @property
    def needs_token_counts(self) -> bool:
        penalties = (self.repetition_penalty, self.frequency_penalty, self.presence_penalty)
        return any(penalty is not None for penalty in penalties)

    @property
    def needs_history(self) -> bool:
        """Whether `__call__` needs each row's tokens so far (penalties, or the watermark's last token)."""
        return self.needs_token_counts or bool(self.watermark_rows)

    def __call__(self, scores: torch.Tensor, token_ids: torch.Tensor | None = None,
                 token_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token ids `[batch]` and the log-softmax of the processed scores `[batch, vocab]`.

        `token_ids`/`token_mask` (each row's tokens so far) are needed only for penalties.
        `scores` must be the step's own: grammar masks are added into its constrained rows in place.
        """
        scores = self.process(scores, token_ids, token_mask)
        next_ids = self.choose(scores)
        if self.grammar_rows:
            self._advance_grammars(next_ids)
        return next_ids, torch.log_softmax(scores, dim=-1)

    def process(self, scores: torch.Tensor, token_ids: torch.Tensor | None,
                token_mask: torch.Tensor | None) -> torch.Tensor:
        scores = scores.float()
        if self.watermark_rows:
            assert token_ids is not None, "watermarking reads each row's previous token"
            # left padding: every row's last column is its latest token
            scores = watermark.apply(scores, token_ids[:, -1], self.watermark_rows)
        if self.needs_token_counts:
            assert token_ids is not None and token_mask is not None, "penalties count the previous tokens"
            counts = processors.token_counts(scores, token_ids, token_mask)
            if self.repetition_penalty is not None:
                scores = processors.repetition_penalty(scores, counts, self.repetition_penalty)
            if self.frequency_penalty is not None:
                scores = processors.frequency_penalty(scores, counts, self.frequency_penalty)
            if self.presence_penalty is not None:
                scores = processors.presence_penalty(scores, counts, self.presence_penalty)
        if self.logit_bias is not None:
            scores = processors.logit_bias(scores, *self.logit_bias)
        if self.grammar_rows:
            scores = grammars.apply_masks(scores, self.grammar_rows, self._constrained_states())
        if self.temperature is not None:
            scores = processors.temperature(scores, self.temperature)
        if self.top_k is not None:
            scores = processors.top_k(scores, self.top_k, self.max_top_k)
        if self.top_p is not None:
            scores = processors.top_p(scores, self.top_p)
        if self.typical_p is not None:
            scores = processors.typical_p(scores, self.typical_p)
        return scores

    def choose(self, scores: torch.Tensor) -> torch.Tensor:
        """Argmax for every row, then the sampling rows drawn from their own generators."""
        next_ids = scores.argmax(dim=-1)
        if self.sample_rows:
            rows = torch.tensor(self.sample_rows, device=scores.device)
            probs = torch.softmax(scores.index_select(0, rows), dim=-1)
            # exponential race (Gumbel-max): argmax(p / q), q ~ Exp(1), samples from p without
            # the host sync torch.multinomial does
            noise = torch.empty_like(probs)
            for j, i in enumerate(self.sample_rows):
                noise[j].exponential_(generator=self.generators[i])
            next_ids[rows] = (probs / noise).argmax(dim=-1)
        return next_ids

    def _constrained_states(self) -> list[grammars.GrammarState]:
        states = (self.grammar_states[i] for i in self.grammar_rows)  # the rows that have a state
        return [state for state in states if state is not None]

    def _advance_grammars(self, next_ids: torch.Tensor) -> None:
        """The constrained rows take their tokens (one host transfer, of those rows only)."""
        rows = torch.tensor(self.grammar_rows, device=next_ids.device)
        grammars.advance(self._constrained_states(), next_ids.index_select(0, rows).tolist())

    def grammar_failure(self, row: int) -> str | None:
        """Why row `row`'s grammar failed, if it did (the request must end with an error)."""
        state = self.grammar_states[row]
        return None if state is None else state.failure

    def replay(self, row: int, generated: Sequence[int], vocab_size: int) -> None:
        """Row `row` continues after `generated`, its own tokens from before a resume: its grammar
        takes them, and its generator makes the draws that choosing them made (one exponential
        per vocabulary entry and token, as `choose`), so a resumed request goes on exactly as if it
        had never stopped. Penalties need nothing: they count the row's tokens, which hold these."""
        state = self.grammar_states[row]
        if state is not None:
            for token_id in generated:
                state.consume(token_id)
        generator = self.generators[row]
        if generator is not None:
            noise = torch.empty(vocab_size, dtype=torch.float32, device=generator.device)
            for _ in generated:
                noise.exponential_(generator=generator)

    def select(self, indices: Sequence[int]) -> NextTokenChooser:
        """The chooser of the rows `indices` (in that order), generators and grammar states carried over."""
        return NextTokenChooser([self.params[i] for i in indices], self.device,
                                [self.generators[i] for i in indices],
                                [self.grammar_states[i] for i in indices])

    @classmethod
    def concatenate(cls, choosers: Sequence[NextTokenChooser]) -> NextTokenChooser:
        return cls([p for c in choosers for p in c.params], choosers[0].device,
                   [g for c in choosers for g in c.generators],
                   [s for c in choosers for s in c.grammar_states])


def _seeded_generator(seed: int, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device)
    generator.manual_seed(seed)
    return generator
