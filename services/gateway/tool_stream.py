"""Tool calls read from a streamed answer as it comes, for OpenAI's `delta.tool_calls`.

The grammar fixes how calls are written (`ztgi.common.tool_calls`), so reading them needs no JSON
parser: an answer that begins with `<tool_call>` is calls; each call's name comes between fixed
texts, and its arguments run until `}` + newline + `</tool_call>` (JSON written compactly holds no
raw newline). Text that might still become the start of a call is held back; the rest of an
argument is sent as soon as it cannot be part of that end.
"""

from __future__ import annotations

import dataclasses
import uuid

from ztgi.common.tool_calls import (
    ARGUMENTS_PREFIX,
    ARGUMENTS_SUFFIX,
    CALL_CLOSE,
    CALL_OPEN,
    CALL_SEPARATOR,
    NAME_PREFIX,
)

_START = CALL_OPEN + NAME_PREFIX
_END = ARGUMENTS_SUFFIX + CALL_CLOSE


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclasses.dataclass
class ToolCallDelta:
    """Part of call `index`: its start (`id` and `name` set) and/or a piece of its arguments."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def json(self) -> dict:
        function = {"arguments": self.arguments}
        if self.name is None:
            return {"index": self.index, "function": function}
        return {"index": self.index, "id": self.id, "type": "function", "function": {"name": self.name, **function}}


class ToolCallStream:
    """Feed it the answer's text piece by piece; it says what is content and what is a call."""

    def __init__(self) -> None:
        self.buffer = ""
        self.mode = "undecided"  # then "text" or "calls"
        self.position = 0  # in calls mode: where the unread part of `buffer` starts
        self.state = "open"  # in calls mode: "open", "name", "arguments"
        self.sent = 0  # in the arguments state: how much of them was sent
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> tuple[str | None, list[ToolCallDelta]]:
        """(content to show, or None once the answer is calls; the call deltas this text completes)."""
        self.buffer += text
        if self.mode == "undecided":
            if self.buffer.startswith(CALL_OPEN.strip()):
                self.mode = "calls"
            elif CALL_OPEN.strip().startswith(self.buffer) and not final:
                return "", []
            else:
                self.mode = "text"
                text, self.buffer = self.buffer, ""
        if self.mode == "text":
            return text, []
        return None, self._read_calls(final)

    def _read_calls(self, final: bool) -> list[ToolCallDelta]:
        deltas: list[ToolCallDelta] = []
        while True:
            if self.state == "open":
                if self.buffer.startswith(CALL_SEPARATOR, self.position) and not self.buffer.startswith(
                        _START, self.position):
                    self.position += len(CALL_SEPARATOR)
                if not self.buffer.startswith(_START, self.position):
                    return deltas
                self.position += len(_START)
                self.state = "name"
            elif self.state == "name":
                end = self.buffer.find(ARGUMENTS_PREFIX, self.position)
                if end < 0:
                    return deltas
                deltas.append(ToolCallDelta(self.num_calls, "", new_call_id(), self.buffer[self.position:end]))
                self.num_calls += 1
                self.position, self.sent, self.state = end + len(ARGUMENTS_PREFIX), 0, "arguments"
            else:
                end = self.buffer.find(_END, self.position)
                stop = end if end >= 0 else (len(self.buffer) if final else len(self.buffer) - len(_END) + 1)
                piece = self.buffer[self.position + self.sent:max(stop, self.position + self.sent)]
                if piece:
                    self._add_arguments(deltas, piece)
                    self.sent += len(piece)
                if end < 0:
                    return deltas
                self.position, self.state = end + len(_END), "open"

    def _add_arguments(self, deltas: list[ToolCallDelta], piece: str) -> None:
        if deltas and deltas[-1].index == self.num_calls - 1:
            deltas[-1].arguments += piece
        else:
            deltas.append(ToolCallDelta(self.num_calls - 1, piece))
