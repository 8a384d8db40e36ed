"""Chat turns, the tools a model may call, and the grammars that constrain its answer."""

from __future__ import annotations

from typing import Literal

from ztgi.common.codec import record
from ztgi.common.messages.images import ContentPart

__all__ = ["Grammar", "Tool", "ToolCall", "ChatMessage", "GrammarType"]

GrammarType = Literal["json", "regex", "lark"]


@record
class Grammar:
    """A constraint on the generated text (TGI's `grammar`): `value` is a JSON Schema as JSON
    text (`json`), a regular expression (`regex`), or a Lark grammar (`lark`, what tool calls use;
    llguidance's syntax, JSON schemas embedded as `%json{...}`)."""

    type: GrammarType
    value: str


@record
class Tool:
    """A function a chat model may call: `parameters` is its arguments' JSON Schema as JSON text."""

    name: str
    description: str | None
    parameters: str


@record
class ToolCall:
    """A call an assistant made (OpenAI's `tool_calls` item): `arguments` is JSON text."""

    id: str
    name: str
    arguments: str


@record
class ChatMessage:
    """One chat turn; structured OpenAI content is flattened to text by the gateway.

    An assistant turn may carry the `tool_calls` it made; a `tool` turn answers the call
    `tool_call_id`. A turn with images has `parts`: its text and images in order (`content` is then
    its text alone), what a vision model's chat template places its image tokens by.
    """

    role: str
    content: str
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    parts: list[ContentPart] | None = None
