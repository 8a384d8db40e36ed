"""The three streaming APIs: the request each one takes and how to read its SSE events.

Only `data:` lines matter. A backend turns one event's payload into a `StreamChunk`: did it
carry a token, is it the last event, is it an error, and what the server counted itself.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ztgi.bench.config import BenchConfig
from ztgi.bench.workload import Prompt


@dataclasses.dataclass(frozen=True, slots=True)
class StreamChunk:
    """One SSE event as the bench sees it."""

    has_token: bool = False
    done: bool = False
    error: str | None = None
    num_reported_tokens: int | None = None  # the server's own count (TGI details, OpenAI usage)
    text: str | None = None  # TGI: the final event's generated_text
    cached_tokens: int | None = None  # prompt tokens the server took from its prefix cache, where it says


class HttpBackend:
    """An API: its path, the JSON body of a request, the parser of its events."""

    name = ""
    path = ""

    def __init__(self, config: BenchConfig) -> None:
        self.config = config

    def payload(self, prompt: Prompt) -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, data: bytes) -> StreamChunk:
        """The chunk of one `data:` payload (the bytes after `data:`)."""
        try:
            event = json.loads(data)
        except ValueError:
            return StreamChunk(error=f"malformed event: {data[:200]!r}")
        if not isinstance(event, dict):
            return StreamChunk(error=f"malformed event: {data[:200]!r}")
        if event.get("error") is not None or event.get("object") == "error":
            return StreamChunk(error=error_text(event))
        return self.parse_event(event)

    def parse_event(self, event: dict[str, Any]) -> StreamChunk:
        raise NotImplementedError


class TgiBackend(HttpBackend):
    """TGI's `POST /generate_stream`: one event per token, the last with `generated_text`."""

    name = "tgi"
    path = "/generate_stream"

    def payload(self, prompt: Prompt) -> dict[str, Any]:
        parameters: dict[str, Any] = {"max_new_tokens": prompt.max_new_tokens}
        if self.config.temperature > 0:
            parameters.update(do_sample=True, temperature=self.config.temperature, seed=self.config.seed)
        if self.config.ignore_eos:
            parameters["ignore_eos"] = True
        if prompt.adapter is not None:
            parameters["adapter_id"] = prompt.adapter
        return {"inputs": prompt.text, "parameters": parameters}

    def parse_event(self, event: dict[str, Any]) -> StreamChunk:
        details = event.get("details")
        details = details if isinstance(details, dict) else {}
        return StreamChunk(has_token=event.get("token") is not None,
                           done=event.get("generated_text") is not None,
                           num_reported_tokens=details.get("generated_tokens"),
                           text=event.get("generated_text"), cached_tokens=details.get("cached_tokens"))


class OpenAICompletionsBackend(HttpBackend):
    """OpenAI's `POST /v1/completions` streaming: text chunks, usage, then `data: [DONE]`."""

    name = "openai-completions"
    path = "/v1/completions"

    def payload(self, prompt: Prompt) -> dict[str, Any]:
        return {"prompt": prompt.text, **self._common(prompt)}

    def _common(self, prompt: Prompt) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": prompt.adapter or self.config.model, "max_tokens": prompt.max_new_tokens, "stream": True,
            "temperature": self.config.temperature, "stream_options": {"include_usage": True},
        }
        if self.config.temperature > 0:
            body["seed"] = self.config.seed
        if self.config.ignore_eos:
            body["ignore_eos"] = True  # vLLM's and ztgi's extension
        return body

    def parse(self, data: bytes) -> StreamChunk:
        if data == b"[DONE]":
            return StreamChunk(done=True)
        return super().parse(data)

    def parse_event(self, event: dict[str, Any]) -> StreamChunk:
        usage = event.get("usage")
        reported = usage.get("completion_tokens") if isinstance(usage, dict) else None
        return StreamChunk(has_token=bool(self.text(event)), num_reported_tokens=reported)

    def text(self, event: dict[str, Any]) -> str | None:
        choices = event.get("choices") or [{}]
        return choices[0].get("text")


class OpenAIChatBackend(OpenAICompletionsBackend):
    """OpenAI's `POST /v1/chat/completions` streaming; the prompt is one user message."""

    name = "openai-chat"
    path = "/v1/chat/completions"

    def payload(self, prompt: Prompt) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": prompt.text}], **self._common(prompt)}

    def text(self, event: dict[str, Any]) -> str | None:
        choices = event.get("choices") or [{}]
        delta = choices[0].get("delta") or {}
        return delta.get("content")


BACKENDS: dict[str, type[HttpBackend]] = {
    backend.name: backend for backend in (TgiBackend, OpenAICompletionsBackend, OpenAIChatBackend)
}


def make_backend(config: BenchConfig) -> HttpBackend:
    return BACKENDS[config.backend](config)


def error_text(event: dict[str, Any]) -> str:
    """TGI's `{error, error_type}`, OpenAI's `{error: {message, type}}` or `{object: error}`."""
    error = event.get("error")
    if isinstance(error, dict):
        message, kind = error.get("message"), error.get("type")
    elif error is not None:
        message, kind = error, event.get("error_type")
    else:
        message, kind = event.get("message"), event.get("type")
    return f"{kind}: {message}" if kind else str(message)
