"""Stop sequences matched in a request's streamed text, across token boundaries."""

from __future__ import annotations


class StopSequences:
    """Finds the first stop sequence that completes inside a token's new text.

    Only the last `max_len - 1` characters before the new text are kept, enough for a sequence
    that starts in earlier tokens and ends in this one.
    """

    def __init__(self, sequences: list[str]) -> None:
        self.sequences = [s for s in sequences if s]
        self.max_len = max((len(s) for s in self.sequences), default=0)
        self.tail = ""

    def find(self, text: str) -> int | None:
        """The end (an index into `text`) of the earliest stop sequence completed by `text`,
        or None; remembers `text` for the next call."""
        if not self.sequences or not text:
            return None
        window = self.tail + text
        found = (self._end_in(window, sequence) for sequence in self.sequences)
        ends = [end for end in found if end is not None]
        self.tail = window[-(self.max_len - 1):] if self.max_len > 1 else ""
        return min(ends) - (len(window) - len(text)) if ends else None

    def _end_in(self, window: str, sequence: str) -> int | None:
        # start late enough that a hit ends in the new text: earlier hits were already reported
        start = max(0, len(self.tail) - len(sequence) + 1)
        index = window.find(sequence, start)
        return None if index < 0 else index + len(sequence)
