"""Prompt lookup: proposals for speculative decoding taken from the request's own tokens.

Input-grounded outputs (code edits, rewrites, extraction, answers that quote their sources)
repeat their prompt: after the last few tokens, what followed the same tokens earlier is a good
guess of what comes next. The index maps every n-gram (n up to `MAX_NGRAM`) of the prompt and
the output so far to where it last ended, so a proposal costs a few dict look-ups, not a scan.
"""

from __future__ import annotations

MAX_NGRAM = 3


class PromptLookup:
    """One request's n-gram index; its tokens only ever grow (a resumed request gets a new one)."""

    __slots__ = ("_ngram_to_end", "_num_indexed")

    def __init__(self) -> None:
        self._ngram_to_end: dict[tuple[int, ...], int] = {}
        self._num_indexed = 1  # the next n-gram end to index (an end e is followed by tokens[e])

    def propose(self, tokens: list[int], count: int) -> list[int]:
        """Up to `count` tokens that followed the latest earlier occurrence of the longest suffix
        of `tokens` (at most MAX_NGRAM long) found; [] when none occurred before."""
        if count < 1 or len(tokens) < 2:
            return []
        self._index(tokens, len(tokens) - 1)
        for n in range(min(MAX_NGRAM, len(tokens) - 1), 0, -1):
            end = self._ngram_to_end.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end:end + count]
        return []

    def _index(self, tokens: list[int], last_end: int) -> None:
        """Indexes the n-grams ending at `[num_indexed, last_end]` (each followed by a token)."""
        for end in range(self._num_indexed, last_end + 1):
            for n in range(1, min(MAX_NGRAM, end) + 1):
                self._ngram_to_end[tuple(tokens[end - n:end])] = end
        self._num_indexed = max(self._num_indexed, last_end + 1)
