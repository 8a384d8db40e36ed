"""OpenAI leaves a stop sequence out of the text; the pipeline ends the text right after it.

`StopTrimmer` holds back streamed text that could still become a stop sequence, and drops the
sequence when the request ends on it; `trim_stop` does the same for a whole text.
"""

from __future__ import annotations


def trim_stop(text: str, stop: list[str], stopped: bool) -> str:
    """`text` without the stop sequence it ends with, when it ended on one."""
    if not stopped:
        return text
    ends = [sequence for sequence in stop if text.endswith(sequence)]
    return text[:len(text) - max(map(len, ends))] if ends else text


class StopTrimmer:
    """One stream's text with stop sequences left out (a no-op without stop sequences)."""

    def __init__(self, stop: list[str]) -> None:
        self.stop = stop
        self.pending = ""

    def feed(self, text: str, final: bool = False, stopped: bool = False) -> str:
        """The text that is safe to send now; on the final event, all of it but the stop sequence."""
        buffered = self.pending + text
        if final:
            self.pending = ""
            return trim_stop(buffered, self.stop, stopped)
        held = self._held_length(buffered)
        self.pending = buffered[len(buffered) - held:] if held else ""
        return buffered[:len(buffered) - held]

    def _held_length(self, text: str) -> int:
        """Length of the longest end of `text` that begins some stop sequence."""
        for length in range(min(len(text), max(map(len, self.stop), default=0)), 0, -1):
            if any(sequence.startswith(text[-length:]) for sequence in self.stop):
                return length
        return 0
