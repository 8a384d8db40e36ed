"""A streamed Response: a generation's token events as the Responses API's named events.

The order is OpenAI's: `response.created`, `response.in_progress`; for a message
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`...,
`response.output_text.done`, `response.content_part.done`, `response.output_item.done`; for each
tool call `response.output_item.added`, `response.function_call_arguments.delta`...,
`response.function_call_arguments.done`, `response.output_item.done`; last `response.completed`
(or `response.incomplete` when `max_output_tokens` ended it); an error after the first token
ends it with `error` and `response.failed`. Every event carries its
`sequence_number`. With tools, text that may still begin a call is held back (`ToolCallStream`);
a call cut short by the token limit ends as an `incomplete` item.
"""

from __future__ import annotations

from typing import Any

from ztgi.common.client.errors import ZtgiError
from ztgi.common.messages import FinalDetails, StreamEvent
from ztgi.services.gateway.responses_render import (
    Item,
    ResponseFrame,
    error_json,
    function_call_item,
    message_item,
    new_item_id,
    text_part,
    truncated,
)
from ztgi.services.gateway.sse import NamedEvent
from ztgi.services.gateway.tool_stream import ToolCallDelta, ToolCallStream


class ResponseEvents:
    """One response's events: `start()`, then `feed(event)` for each token event."""

    def __init__(self, frame: ResponseFrame, tools: bool) -> None:
        self.frame = frame
        self.calls = ToolCallStream() if tools else None
        self.output: list[Item] = []  # finished items
        self.item: Item | None = None  # the item being written
        self.text = ""  # the open message's text, or the open call's arguments
        self.sequence_number = 0
        self.final: dict[str, Any] | None = None  # the finished response object, once written

    def start(self) -> list[NamedEvent]:
        in_progress = self.frame.response_json([], None, status="in_progress")
        return [self._event("response.created", response=in_progress),
                self._event("response.in_progress", response=in_progress)]

    def feed(self, event: StreamEvent) -> list[NamedEvent]:
        text = "" if event.token is None or event.token.special else event.token.text
        if self.calls is None:
            events = self._write_text(text)
        else:
            content, deltas = self.calls.feed(text, final=event.is_final)
            events = self._write_text(content or "")
            for delta in deltas:
                events += self._write_call(delta)
        if event.is_final:
            events += self._finish(event.details)
        return events

    def _write_text(self, text: str) -> list[NamedEvent]:
        if not text:
            return []
        events = [] if self.item is not None else self._open(message_item(new_item_id("msg"), "", "in_progress"))
        self.text += text
        return [*events, self._event("response.output_text.delta", **self._content_place(), delta=text, logprobs=[])]

    def _write_call(self, delta: ToolCallDelta) -> list[NamedEvent]:
        events = []
        if delta.name is not None:
            events += self._close("completed")
            assert delta.id is not None, "a call's first delta names it"
            events += self._open(function_call_item(new_item_id("fc"), delta.id, delta.name, "", "in_progress"))
        if delta.arguments:
            self.text += delta.arguments
            events.append(self._event("response.function_call_arguments.delta", **self._item_place(),
                                      delta=delta.arguments))
        return events

    def _open(self, item: Item) -> list[NamedEvent]:
        self.item, self.text = item, ""
        events = [self._event("response.output_item.added", output_index=len(self.output), item=item)]
        if item["type"] == "message":
            events.append(self._event("response.content_part.added", **self._content_place(), part=text_part("")))
        return events

    def _close(self, status: str) -> list[NamedEvent]:
        item = self.item
        if item is None:
            return []
        if item["type"] == "message":
            item = message_item(item["id"], self.text, status)
            events = [self._event("response.output_text.done", **self._content_place(), text=self.text, logprobs=[]),
                      self._event("response.content_part.done", **self._content_place(), part=text_part(self.text))]
        else:
            item = {**item, "arguments": self.text, "status": status}
            events = [self._event("response.function_call_arguments.done", **self._item_place(),
                                  arguments=self.text)]
        events.append(self._event("response.output_item.done", output_index=len(self.output), item=item))
        self.output.append(item)
        self.item, self.text = None, ""
        return events

    def _finish(self, details: FinalDetails | None) -> list[NamedEvent]:
        """Closes the last item (an empty message when there was none), then the response."""
        events = [] if self.output or self.item else self._open(message_item(new_item_id("msg"), "", "in_progress"))
        events += self._close("incomplete" if truncated(details) else "completed")
        response = self.final = self.frame.response_json(self.output, details)
        name = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return [*events, self._event(name, response=response)]

    def fail(self, error: ZtgiError) -> list[NamedEvent]:
        """An error ended the generation: an `error` event, then `response.failed` with what
        was finished before it."""
        failed = self.frame.response_json(self.output, None, "failed", error_json(error.message, error.error_type))
        return [self._event("error", code=error.error_type, message=error.message, param=None),
                self._event("response.failed", response=failed)]

    def _item_place(self) -> dict[str, Any]:
        assert self.item is not None, "an item is open"
        return {"item_id": self.item["id"], "output_index": len(self.output)}

    def _content_place(self) -> dict[str, Any]:
        return {**self._item_place(), "content_index": 0}

    def _event(self, name: str, **fields: Any) -> NamedEvent:
        event = NamedEvent(name, {"type": name, "sequence_number": self.sequence_number, **fields})
        self.sequence_number += 1
        return event
