"""`--reasoning-parser`: a reasoning model's answer split into its reasoning and its content.

Models such as Qwen3 and the DeepSeek-R1 distills write their reasoning between `<think>` and
`</think>`, then the answer. Some chat templates open the block themselves (the prompt ends with
`<think>`): the answer then starts inside the reasoning and only `</think>` appears
(`ReasoningStart` tells which). The parser is fed the answer piece by piece, as it streams, and
holds back only text that may still turn out to be a tag, so a tag split across tokens is found;
a whole answer is the same parser fed once. An answer that does not begin with `<think>` (and
whose template did not open one) is all content.
"""

from __future__ import annotations

import dataclasses

from ztgi.common.config import require

OPEN = "<think>"
CLOSE = "</think>"
THINK = "think"
REASONING_PARSERS = {THINK: THINK, "deepseek_r1": THINK, "qwen3": THINK}
"""Accepted names (vLLM's among them) to the parser they select."""


def check_reasoning_parser(name: str | None, flag: str = "--reasoning-parser") -> None:
    """ConfigError naming the accepted parsers when `name` is not one of them."""
    require(name is None or name in REASONING_PARSERS,
            f"{flag} {name!r} is not a reasoning parser: use one of {', '.join(REASONING_PARSERS)}")


@dataclasses.dataclass
class ReasoningSplit:
    """What one piece of the answer added to the reasoning and to the content."""

    reasoning: str = ""
    content: str = ""


class ReasoningStream:
    """Feed it the answer's text; it says what is reasoning and what is content."""

    def __init__(self, opened: bool = False) -> None:
        self.opened = opened
        self.state = "start"  # then "reasoning", "answer_start", "content"
        self.buffer = ""

    def feed(self, text: str, final: bool = False) -> ReasoningSplit:
        self.buffer += text
        split = ReasoningSplit()
        if self.state == "start":
            self._read_start(final)
        if self.state == "reasoning":
            split.reasoning = self._read_reasoning(final)
        if self.state == "answer_start":
            self._read_answer_start(final)
        if self.state == "content":
            split.content, self.buffer = self.buffer, ""
        return split

    def _read_start(self, final: bool) -> None:
        """`<think>` first (after blank space) opens the reasoning; anything else is the answer,
        or the reasoning when the template opened it (a model may still write `<think>` again)."""
        head = self.buffer.lstrip()
        if head.startswith(OPEN):
            self.state, self.buffer = "reasoning", head[len(OPEN):]
        elif not OPEN.startswith(head) or final:
            self.state = "reasoning" if self.opened else "content"

    def _read_reasoning(self, final: bool) -> str:
        end = self.buffer.find(CLOSE)
        if end >= 0:
            reasoning, self.buffer = self.buffer[:end], self.buffer[end + len(CLOSE):]
            self.state = "answer_start"
            return reasoning
        keep = 0 if final else _partial_tag_length(self.buffer, CLOSE)
        reasoning, self.buffer = self.buffer[:len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
        return reasoning

    def _read_answer_start(self, final: bool) -> None:
        """The blank lines between `</think>` and the answer are neither."""
        self.buffer = self.buffer.lstrip()
        if self.buffer or final:
            self.state = "content"


def split_reasoning(text: str, opened: bool = False) -> ReasoningSplit:
    """A whole answer's reasoning and content."""
    return ReasoningStream(opened).feed(text, final=True)


def _partial_tag_length(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (text to hold back)."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0
