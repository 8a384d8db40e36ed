"""The grammar mask of constrained rows (TGI's grammar logits processor), on llguidance.

Each constrained row of a chooser has a `GrammarState`: its own matcher, a copy of the grammar's
compiled start (compiled once per grammar, `GrammarCompiler`'s cache), and its next mask. A mask
is computed on a helper thread as soon as the row's previous token is known, so it is ready by the
time the next forward's logits are (llguidance drops the GIL while it works). Unconstrained rows
have no state and cost nothing; a chooser with no constrained row does no grammar work at all.

A row whose matcher ends (EOS accepted) or fails keeps a mask that allows only EOS: the request
finishes instead of writing past its grammar.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
from typing import Sequence

import llguidance
import torch

from common.grammar import lltokenizer, new_matcher
from common.messages import Grammar
from common.model_source import DEFAULT_MODEL_ID, resolve_model

logger = logging.getLogger(__name__)

MAX_CACHED_GRAMMARS = 128
FILTERED = -float("inf")
_BITS = torch.arange(32, dtype=torch.int32)


class GrammarCompiler:
    """The model's vocabulary as llguidance sees it, and each grammar compiled once (LRU)."""

    def __init__(self, model_id: str, eos_token_ids: Sequence[int] = ()) -> None:
        self.model_id = model_id
        self.eos_token_ids = list(eos_token_ids)
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
_executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")


def configure(model_id: str, eos_token_ids: Sequence[int] = ()) -> GrammarCompiler:
    """The worker's model (its tokenizer is the grammar's vocabulary); loads it on a helper thread."""
    global _compiler
    _compiler = GrammarCompiler(model_id, eos_token_ids)
    _executor.submit(lambda: _compiler.tokenizer)
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
        self.pending: concurrent.futures.Future | None = None

    @classmethod
    def for_grammar(cls, grammar: Grammar) -> "GrammarState":
        tokenizer = _compiler.tokenizer
        return cls(_compiler.matcher(grammar), tokenizer.eos_token, tokenizer.vocab_size)

    def consume(self, token_id: int) -> None:
        if self.ended:
            return
        if not self.matcher.consume_token(token_id) or self.matcher.is_error():
            logger.warning("grammar refused token %d: %s; ending the row", token_id, self.matcher.get_error())
            self.ended = True
        elif self.matcher.is_stopped():
            self.ended = True

    def compute_mask(self) -> None:
        """The next token's mask (on the helper thread; the GIL is dropped while llguidance works)."""
        if not self.ended:
            self.matcher.unsafe_compute_mask_ptr(self.mask.data_ptr(), self.mask.numel() * 4)
            if not self.matcher.is_error():
                return
            logger.warning("grammar failed: %s; ending the row", self.matcher.get_error())
            self.ended = True
        self.mask.zero_()
        self.mask[self.eos_token_id // 32] = 1 << (self.eos_token_id % 32)

    def wait(self) -> torch.Tensor:
        if self.pending is not None:
            self.pending.result()
            self.pending = None
        return self.mask


def new_states(grammars: Sequence[Grammar | None]) -> list[GrammarState | None]:
    """A state per constrained row (None for the others), their first masks already on their way."""
    states = [GrammarState.for_grammar(g) if g is not None else None for g in grammars]
    start_masks([s for s in states if s is not None])
    return states


def start_masks(states: Sequence[GrammarState]) -> None:
    """Computes these rows' next masks on the helper thread (each row waits for its own)."""
    if not states:
        return

    def compute() -> None:
        for state in states:
            state.compute_mask()

    future = _executor.submit(compute)
    for state in states:
        state.pending = future


def apply_masks(scores: torch.Tensor, rows: Sequence[int], states: Sequence[GrammarState]) -> torch.Tensor:
    """Scores with every token the grammar forbids set to -inf, in the constrained `rows` only."""
    words = torch.stack([state.wait() for state in states])
    allowed = ((words.unsqueeze(-1) >> _BITS) & 1).view(len(states), -1).bool()
    vocab_size = scores.shape[-1]
    if allowed.shape[1] < vocab_size:  # logits wider than the tokenizer's vocabulary: padding ids
        allowed = torch.nn.functional.pad(allowed, (0, vocab_size - allowed.shape[1]))
    allowed = allowed[:, :vocab_size].to(scores.device, non_blocking=True)
    index = torch.tensor(rows, device=scores.device)
    return scores.index_copy(0, index, scores.index_select(0, index).masked_fill(~allowed, FILTERED))


def advance(states: Sequence[GrammarState], token_ids: Sequence[int]) -> None:
    """Each row takes its chosen token, then its next mask starts."""
    for state, token_id in zip(states, token_ids):
        state.consume(token_id)
    start_masks(states)
