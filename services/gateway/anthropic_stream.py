"""One Messages answer as Anthropic's stream events, built token by token.

`message_start`, then per content block `content_block_start`, its deltas (`thinking_delta`,
`text_delta`, or a tool call's arguments as `input_json_delta`) and `content_block_stop`, then
`message_delta` (stop reason, usage) and `message_stop`. A token's text goes through the same
readers as a chat stream's: stop sequences held back and left out, the reasoning split off, then
tool calls read from the content.
"""

from __future__ import annotations

from typing import Any

from ztgi.common.messages import FinalDetails, StreamEvent
from ztgi.services.gateway.anthropic_errors import anthropic_error_json
from ztgi.services.gateway.anthropic_render import (
    matched_stop_sequence,
    message_json,
    new_tool_use_id,
    stop_reason,
    text_block,
    thinking_block,
    tool_use_block,
)
from ztgi.services.gateway.errors import status_for
from ztgi.services.gateway.reasoning_parser import ReasoningSplit, ReasoningStream
from ztgi.services.gateway.sse import NamedEvent
from ztgi.services.gateway.stop_trim import StopTrimmer
from ztgi.services.gateway.tool_stream import ToolCallDelta, ToolCallStream

_BLOCK_STARTS = {"thinking": thinking_block(""), "text": text_block("")}


def error_event(error: str, error_type: str) -> NamedEvent:
    """A failure after the stream began, as Anthropic's `error` event."""
    return NamedEvent("error", anthropic_error_json(error, status_for(error_type)))


class MessageStream:
    """Feed it the answer's events; it gives the stream events to send for each."""

    def __init__(self, message_id: str, model: str, stop_sequences: list[str], opened: bool | None,
                 tools: bool) -> None:
        self.message_id = message_id
        self.model = model
        self.stop_sequences = stop_sequences
        self.trimmer = StopTrimmer(stop_sequences)
        self.reasoner = None if opened is None else ReasoningStream(opened)
        self.calls = ToolCallStream() if tools else None
        self.text = ""  # everything generated, stop sequence included
        self.block: str | None = None  # the type of the open content block
        self.index = -1
        self.started = False

    def feed(self, event: StreamEvent) -> list[NamedEvent]:
        events = [] if self.started else [self._message_start()]
        self.started = True
        split = self._split(event)
        if split.reasoning:
            events += self._delta("thinking", {"type": "thinking_delta", "thinking": split.reasoning})
        content, calls = (split.content, []) if self.calls is None else \
            self.calls.feed(split.content, final=event.is_final)
        if content:
            events += self._delta("text", {"type": "text_delta", "text": content})
        for call in calls:
            events += self._call(call)
        if event.is_final:
            events += self._finish(event.details)
        return events

    def _split(self, event: StreamEvent) -> ReasoningSplit:
        text = "" if event.token is None or event.token.special else event.token.text
        self.text += text
        stopped = event.details is not None and event.details.finish_reason == "stop_sequence"
        visible = self.trimmer.feed(text, final=event.is_final, stopped=stopped)
        if self.reasoner is None:
            return ReasoningSplit(content=visible)
        return self.reasoner.feed(visible, final=event.is_final)

    def _message_start(self) -> NamedEvent:
        message = message_json(self.message_id, self.model, [], None, None, 0, 0)
        return NamedEvent("message_start", {"type": "message_start", "message": message})

    def _open(self, kind: str, block: dict[str, Any]) -> list[NamedEvent]:
        events = self._close()
        self.index += 1
        self.block = kind
        return events + [NamedEvent("content_block_start", {"type": "content_block_start", "index": self.index,
                                                            "content_block": block})]

    def _close(self) -> list[NamedEvent]:
        if self.block is None:
            return []
        self.block = None
        return [NamedEvent("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _delta(self, kind: str, delta: dict[str, Any]) -> list[NamedEvent]:
        events = [] if self.block == kind else self._open(kind, _BLOCK_STARTS[kind])
        return events + [NamedEvent("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                            "delta": delta})]

    def _call(self, call: ToolCallDelta) -> list[NamedEvent]:
        """A call's start opens a tool_use block; its arguments are that block's JSON, in pieces."""
        events = [] if call.name is None else self._open("tool_use", tool_use_block(new_tool_use_id(), call.name, {}))
        if call.arguments:
            events += [NamedEvent("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                          "delta": {"type": "input_json_delta",
                                                                    "partial_json": call.arguments}})]
        return events

    def _finish(self, details: FinalDetails | None) -> list[NamedEvent]:
        called = self.calls is not None and self.calls.num_calls > 0
        delta = {"stop_reason": stop_reason(details, called),
                 "stop_sequence": matched_stop_sequence(self.text, details, self.stop_sequences)}
        usage = {"input_tokens": details.input_tokens if details is not None else 0,
                 "output_tokens": details.generated_tokens if details is not None else 0}
        return self._close() + [NamedEvent("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}),
                                NamedEvent("message_stop", {"type": "message_stop"})]
