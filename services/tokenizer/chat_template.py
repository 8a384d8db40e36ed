"""A conversation, with its tools and tool calls, through the model's chat template.

A template with a tool format (it renders the `tools` it is given, as Qwen's, Llama 3.1's or
Hermes' do) gets OpenAI's structure as Hugging Face templates expect it: `tools`, assistant
`tool_calls` (arguments as an object) and `tool` turns with their `tool_call_id`. A template
without one (SmolLM2's ChatML) gets the same conversation in words: the tools listed in the system
message (`ztgi.common.tool_calls.tools_prompt`), earlier calls written as the model writes them, and
tool results as user turns in `<tool_response>` blocks.

A turn with images (`ChatMessage.parts`) gets Hugging Face's structured content, a list of
`{"type": "text", "text": ...}` and `{"type": "image"}` in order: the template writes the family's
image placeholder where each image goes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerBase

from ztgi.common.messages import ChatMessage, Tool
from ztgi.common.parameters import ValidationError
from ztgi.common.tool_calls import RESPONSE_CLOSE, RESPONSE_OPEN, call_text, tool_json, tools_prompt

_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool", "description": "probe",
                                                  "parameters": {"type": "object", "properties": {}}}}


class ChatTemplate:
    """Renders conversations; finds out once whether the template has a tool format."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._has_tool_format: bool | None = None

    @property
    def has_tool_format(self) -> bool:
        """Whether the template renders tools: a probe conversation with one differs from one without."""
        if self._has_tool_format is None:
            probe = [{"role": "user", "content": "probe"}]
            try:
                self._has_tool_format = self._apply(probe, [_PROBE_TOOL]) != self._apply(probe, None)
            except Exception:  # a template that fails on tools has no tool format
                self._has_tool_format = False
        return self._has_tool_format

    def render(self, messages: list[ChatMessage], tools: list[Tool] | None) -> str:
        uses_tools = bool(tools) or any(m.tool_calls or m.role == "tool" for m in messages)
        try:
            if uses_tools and not self.has_tool_format:
                return self._apply(_in_words(messages, tools), None)
            return self._apply([_structured(m) for m in messages], [tool_json(t) for t in tools] if tools else None)
        except Exception as exc:  # jinja raises many types (raise_exception, TypeError, no template)
            raise ValidationError("messages", f"Template error: {exc}") from None

    def _apply(self, conversation: list[dict[str, Any]], tools: list[dict[str, Any] | Callable[..., Any]] | None,
               ) -> str:
        text = self.tokenizer.apply_chat_template(conversation, tools=tools, add_generation_prompt=True,
                                                  tokenize=False)
        assert isinstance(text, str), "tokenize=False renders a string"
        return text


def _structured(message: ChatMessage) -> dict[str, Any]:
    """A turn as Hugging Face templates with a tool format expect it."""
    turn: dict[str, Any] = {"role": message.role, "content": _content(message)}
    if message.tool_calls:
        turn["tool_calls"] = [{"id": call.id, "type": "function",
                               "function": {"name": call.name, "arguments": _arguments(call.arguments)}}
                              for call in message.tool_calls]
    if message.tool_call_id is not None:
        turn["tool_call_id"] = message.tool_call_id
    return turn


def _content(message: ChatMessage) -> str | list[dict[str, str]]:
    """The turn's text, or its parts in order where it has images."""
    parts = message.parts or []
    if not any(part.type == "image" for part in parts):
        return message.content
    return [{"type": "text", "text": part.text} if part.type == "text" else {"type": "image"} for part in parts]


def _arguments(arguments: str) -> Any:
    """Arguments as an object where they parse as one (templates write them with `tojson`)."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


def _in_words(messages: list[ChatMessage], tools: list[Tool] | None) -> list[dict[str, Any]]:
    """The conversation for a template without a tool format: only roles and text."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            response = f"{RESPONSE_OPEN}{message.content}{RESPONSE_CLOSE}"
            if turns and turns[-1].get("tool_results"):
                turns[-1]["content"] += "\n" + response
            else:
                turns.append({"role": "user", "content": response, "tool_results": True})
            continue
        content: Any = _content(message)
        if message.tool_calls:
            content = message.content  # an assistant's call is written as text, after its text
            calls = "\n".join(call_text(call.name, call.arguments) for call in message.tool_calls)
            content = f"{content}\n{calls}" if content else calls
        turns.append({"role": message.role, "content": content})
    if tools:
        prompt = tools_prompt(tools)
        if turns and turns[0]["role"] == "system" and isinstance(turns[0]["content"], str):
            turns[0]["content"] = f"{turns[0]['content']}\n\n{prompt}"
        else:
            turns.insert(0, {"role": "system", "content": prompt})
    return [{"role": t["role"], "content": t["content"]} for t in turns]
