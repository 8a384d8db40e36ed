"""The grammar mask of constrained rows (TGI's grammar logits processor), on llguidance.

Each constrained row of a chooser has a `GrammarState`: its own matcher, a copy of the grammar's
compiled start (compiled once per grammar, `GrammarCompiler`'s cache), and its next mask. Masks
are computed when the step's scores are processed, before anything reads them: on CUDA the
forward's kernels are still running then (nothing has waited for them), so the mask costs the step
nothing; on CPU a helper thread cost more in hand-offs than the masks themselves (BENCHMARKS.md).
Unconstrained rows have no state and cost nothing; a chooser with no constrained row does no
grammar work at all.

A row whose matcher ends (EOS accepted) or fails keeps a mask that allows only EOS: the request
finishes instead of writing past its grammar. A failure (a token refused, or a mask that
exceeded llguidance's per-step budget) is kept in `failure`: the request then ends with an error
event, never a 200 whose text breaks its grammar (`sampling/generations.py`).
"""

from __future__ import annotations

import collections
import functools
import logging
import sys
import threading
from collections.abc import Sequence

import llguidance
import torch

from ztgi.common.grammar import lltokenizer, new_matcher
from ztgi.common.messages import Grammar
from ztgi.common.model_source import DEFAULT_MODEL_ID, resolve_model

logger = logging.getLogger(__name__)

MAX_CACHED_GRAMMARS = 128
FILTERED = -float("inf")
assert sys.byteorder == "little", "masks are read byte by byte: bit b of byte j is token 8j + b"


class GrammarCompiler:
    """The model's vocabulary as llguidance sees it, and each grammar compiled once (LRU)."""

    def __init__(self, model_id: str, eos_token_ids: Sequence[int] = ()) -> None:
        self.model_id = model_id
        self.eos_token_ids = sorted(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._compiled: collections.OrderedDict[Grammar, llguidance.LLMatcher] = collections.OrderedDict()

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:  # the preloading thread and the engine may both ask first
            if self._tokenizer is None:
                from transformers import AutoTokenizer
                hf_tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.model_id).path)
                self._tokenizer = lltokenizer(hf_tokenizer, self.eos_token_ids)
            return self._tokenizer

    def matcher(self, grammar: Grammar) -> llguidance.LLMatcher:
        """A fresh matcher at the grammar's start; ValueError when it cannot compile."""
        start = self._compiled.get(grammar)
        if start is None:
            start = new_matcher(self.tokenizer, grammar)  # ValidationError is a ValueError
            self._compiled[grammar] = start
            if len(self._compiled) > MAX_CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(grammar)
        return start.deep_copy()

    @property
    def num_compiled(self) -> int:
        return len(self._compiled)


_compiler = GrammarCompiler(DEFAULT_MODEL_ID)


def configure(model_id: str, eos_token_ids: Sequence[int] = ()) -> GrammarCompiler:
    """The worker's model (its tokenizer is the grammar's vocabulary), loaded now, before the
    worker says Hello: building the vocabulary holds the GIL for a while, which on a helper thread
    starved the heartbeat thread."""
    global _compiler
    _compiler = GrammarCompiler(model_id, eos_token_ids)
    try:
        _ = _compiler.tokenizer  # loads the vocabulary now, not at the first constrained request
    except Exception:  # a model without a fast tokenizer: its constrained requests fail, the rest run
        logger.exception("loading the grammar vocabulary of %s failed", model_id)
    return _compiler


def compiler() -> GrammarCompiler:
    return _compiler


class GrammarState:
    """One constrained row: its matcher and the mask of its next token (int32 words, 32 tokens each)."""

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_id: int, vocab_size: int) -> None:
        self.matcher = matcher
        self.eos_token_id = eos_token_id
        self.mask = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)
        self.ended = False
        self.failure: str | None = None
        self.mask_ready = False

    @classmethod
    def for_grammar(cls, grammar: Grammar) -> GrammarState:
        tokenizer = _compiler.tokenizer
        return cls(_compiler.matcher(grammar), tokenizer.eos_token, tokenizer.vocab_size)

    def consume(self, token_id: int) -> None:
        self.mask_ready = False
        if self.ended:
            return
        if not self.matcher.consume_token(token_id) or self.matcher.is_error():
            self._fail(f"the grammar failed at token {token_id}")
        elif self.matcher.is_stopped():
            self.ended = True

    def _fail(self, what: str) -> None:
        error = " ".join(line.strip() for line in self.matcher.get_error().splitlines() if line.strip())
        self.failure = f"{what}: {error[:300]}" if error else what
        logger.warning("%s; ending the row", self.failure)
        self.ended = True

    def next_mask(self) -> torch.Tensor:
        """The mask of the row's next token (computed once per step)."""
        if not self.mask_ready:
            self._compute_mask()
            self.mask_ready = True
        return self.mask

    def _compute_mask(self) -> None:
        if not self.ended:
            self.matcher.unsafe_compute_mask_ptr(self.mask.data_ptr(), self.mask.numel() * 4)
            if not self.matcher.is_error():
                return
            self._fail("the grammar failed computing its next token")
        self.mask.zero_()
        self.mask[self.eos_token_id // 32] = 1 << (self.eos_token_id % 32)



def new_states(grammars: Sequence[Grammar | None]) -> list[GrammarState | None]:
    """A state per constrained row (None for the others)."""
    return [GrammarState.for_grammar(g) if g is not None else None for g in grammars]


def apply_masks(scores: torch.Tensor, rows: Sequence[int], states: Sequence[GrammarState]) -> torch.Tensor:
    """`scores`, in place, with every token the grammar forbids set to -inf in the constrained
    `rows` only (the caller owns `scores`: the chooser gets a step's own logits).

    Each mask byte becomes its 8 tokens' biases (0 or -inf) through a 256-row table, on the
    scores' device: a gather and an in-place add into the rows (cheaper on CPU than a masked_fill
    of the same size, and than a new scores tensor, whose fresh pages the OS must fault in).
    """
    words = torch.stack([state.next_mask() for state in states]).to(scores.device, non_blocking=True)
    table = _byte_biases(scores.device, scores.dtype)
    bias = table.index_select(0, words.view(torch.uint8).view(-1).long()).view(len(states), -1)
    vocab_size = scores.shape[-1]
    if bias.shape[1] < vocab_size:  # logits wider than the tokenizer's vocabulary: padding ids
        bias = torch.nn.functional.pad(bias, (0, vocab_size - bias.shape[1]), value=FILTERED)
    index = torch.tensor(rows, device=scores.device)
    return scores.index_add_(0, index, bias[:, :vocab_size])


@functools.cache
def _byte_biases(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[256, 8]: for each mask byte, 0 for its allowed tokens and -inf for the others."""
    allowed = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
    return torch.where(allowed.bool(), 0.0, FILTERED).to(device=device, dtype=dtype)


def advance(states: Sequence[GrammarState], token_ids: Sequence[int]) -> None:
    """Each row takes its chosen token."""
    for state, token_id in zip(states, token_ids):
        state.consume(token_id)
