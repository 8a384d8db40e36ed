"""OpenAI's response schemas (TGI's flavour): completions, chunks, usage and the model list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ztgi.common.client.generate_result import GenerateResult
from ztgi.common.messages import FinalDetails, InfoReply, StreamEvent, Token
from ztgi.common.tool_calls import parse_calls
from ztgi.services.gateway.completion_logprobs import logprob_json
from ztgi.services.gateway.tool_stream import ToolCallDelta, new_call_id

_FINISH_REASONS = {"eos_token": "stop", "stop_sequence": "stop", "length": "length"}


class Envelope:
    """What every object of one OpenAI answer shares: id, creation time, model, fingerprint."""

    def __init__(self, prefix: str, request_id: str, created: int, info: InfoReply) -> None:
        self.fields = {"id": f"{prefix}-{request_id}", "created": created, "model": info.model_id,
                       "system_fingerprint": f"{info.version}-native"}

    def wrap(self, kind: str, **body: Any) -> dict[str, Any]:
        return {**self.fields, "object": kind, **body}


def finish_reason(details: FinalDetails | None) -> str | None:
    return None if details is None else _FINISH_REASONS.get(details.finish_reason, details.finish_reason)


def usage_json(all_details: Sequence[FinalDetails | None], n: int = 1) -> dict[str, Any]:
    """Token counts; a prompt with `n` choices counts its tokens once, as OpenAI does, and its
    cached tokens (taken from the prefix cache instead of computed) as their mean over its choices."""
    details = [d for d in all_details if d is not None]
    prompt_tokens = sum(d.input_tokens for d in details) // n
    completion_tokens = sum(d.generated_tokens for d in details)
    cached_tokens = sum(d.cached_tokens for d in details) // n
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _token_text(event: StreamEvent) -> str:
    return "" if event.token is None or event.token.special else event.token.text


def chat_logprobs_json(tokens: list[Token], top_tokens: list[list[Token]]) -> dict[str, Any]:
    return {"content": [
        {"token": token.text, "logprob": logprob_json(token),
         "top_logprobs": [{"token": t.text, "logprob": logprob_json(t)} for t in top]}
        for token, top in zip(tokens, top_tokens)]}


def chat_choice_json(index: int, result: GenerateResult, logprobs: bool, tools: bool = False,
                     reasoning: str | None = None) -> dict[str, Any]:
    """One choice; with `tools`, an answer made of calls is `message.tool_calls` (of an answer cut
    short by `max_tokens`, the calls it finished: finish_reason stays `length`); `reasoning` (with
    `--reasoning-parser`) is `message.reasoning_content`."""
    message: dict[str, Any] = {"role": "assistant", "content": result.text}
    reason = finish_reason(result.details)
    calls = parse_calls(result.text, truncated=reason == "length") if tools else None
    if calls:
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
            for name, arguments in calls]}
        reason = tool_calls_finish_reason(reason)
    if reasoning is not None:
        message["reasoning_content"] = reasoning or None
    return {"index": index, "message": message,
            "logprobs": chat_logprobs_json(result.tokens, result.top_tokens) if logprobs else None,
            "finish_reason": reason}


def tool_calls_finish_reason(reason: str | None) -> str | None:
    """OpenAI's `tool_calls` for an answer of calls that ended by itself."""
    return "tool_calls" if reason == "stop" else reason


def chat_completion_json(envelope: Envelope, results: list[GenerateResult], logprobs: bool,
                         tools: bool = False, reasonings: list[str] | None = None) -> dict[str, Any]:
    """The chat completion with one choice per result (`n`), each with its reasoning when given."""
    choices = [chat_choice_json(index, result, logprobs, tools, None if reasonings is None else reasonings[index])
               for index, result in enumerate(results)]
    return envelope.wrap("chat.completion", choices=choices,
                         usage=usage_json([r.details for r in results], n=len(results)))


def chat_chunk_json(envelope: Envelope, event: StreamEvent, logprobs: bool, index: int = 0,
                    text: str | None = None) -> dict[str, Any]:
    """One token of choice `index` as a delta (`text`: what to show of it; by default its text,
    none for special tokens like EOS)."""
    text = _token_text(event) if text is None else text
    choice = {"index": index, "delta": {"role": "assistant", "content": text},
              "logprobs": (chat_logprobs_json([event.token], [event.top_tokens])
                           if logprobs and event.token is not None else None),
              "finish_reason": finish_reason(event.details)}
    return envelope.wrap("chat.completion.chunk", choices=[choice], usage=None)


def chat_tool_chunk_json(envelope: Envelope, event: StreamEvent, logprobs: bool, index: int, content: str | None,
                         calls: list[ToolCallDelta], num_calls: int) -> dict[str, Any]:
    """A chunk of an answer that may call tools: `content` (None once it is calls) and the
    `delta.tool_calls` pieces this token completed."""
    chunk = chat_chunk_json(envelope, event, logprobs, index, content or "")
    choice = chunk["choices"][0]
    if content is None:
        choice["delta"]["content"] = None
    if calls:
        choice["delta"]["tool_calls"] = [call.json() for call in calls]
    if num_calls:
        choice["finish_reason"] = tool_calls_finish_reason(choice["finish_reason"])
    return chunk


def with_reasoning(chunk: dict[str, Any], reasoning: str) -> dict[str, Any]:
    """The chunk with the reasoning its token added (`delta.reasoning_content`, as vLLM sends it)."""
    if reasoning:
        chunk["choices"][0]["delta"]["reasoning_content"] = reasoning
    return chunk


def chat_usage_chunk_json(envelope: Envelope, details: list[FinalDetails], n: int) -> dict[str, Any]:
    return envelope.wrap("chat.completion.chunk", choices=[], usage=usage_json(details, n))


def completion_choice_json(index: int, text: str, details: FinalDetails | None,
                           logprobs: dict[str, Any] | None) -> dict[str, Any]:
    """One choice; `logprobs` is OpenAI's legacy object (`CompletionLogprobs`), or None."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(details)}


def completion_json(envelope: Envelope, results: list[GenerateResult], logprobs: list[dict[str, Any] | None],
                    n: int = 1) -> dict[str, Any]:
    """The completion: choice `i` is `results[i]` with `logprobs[i]`."""
    choices = [completion_choice_json(i, r.text, r.details, logprobs[i]) for i, r in enumerate(results)]
    return envelope.wrap("text_completion", choices=choices, usage=usage_json([r.details for r in results], n))


def completion_chunk_json(envelope: Envelope, index: int, event: StreamEvent, logprobs: dict[str, Any] | None,
                          text: str | None = None) -> dict[str, Any]:
    """One token of one choice; TGI's schema wants a string finish_reason, "" until the last."""
    text = _token_text(event) if text is None else text
    choice = completion_choice_json(index, text, event.details, logprobs)
    choice["finish_reason"] = choice["finish_reason"] or ""
    return envelope.wrap("text_completion", choices=[choice])


def completion_echo_chunk_json(envelope: Envelope, index: int, prompt: str) -> dict[str, Any]:
    """`echo`: the prompt, as the first chunk of its choice."""
    choice = {**completion_choice_json(index, prompt, None, None), "finish_reason": ""}
    return envelope.wrap("text_completion", choices=[choice])


def completion_usage_chunk_json(envelope: Envelope, details: list[FinalDetails], n: int) -> dict[str, Any]:
    """`stream_options.include_usage`: the last chunk, with no choice and the whole request's usage."""
    return envelope.wrap("text_completion", choices=[], usage=usage_json(details, n))


def model_json(info: InfoReply, adapter: str | None = None) -> dict[str, Any]:
    """The base model's card, or a LoRA adapter's (vLLM's shape: `parent` is the base model; the
    adapter's path is the scheduler's, so `root` is its name). `input_modalities` says whether it
    takes images (clients that do not know the field ignore it)."""
    modalities = ["text", "image"] if info.vision else ["text"]
    if adapter is None:
        return {"id": info.model_id, "object": "model", "created": 0, "owned_by": info.model_id,
                "root": info.model_id, "parent": None, "input_modalities": modalities}
    return {"id": adapter, "object": "model", "created": 0, "owned_by": info.model_id, "root": adapter,
            "parent": info.model_id, "input_modalities": modalities}


def models_json(info: InfoReply) -> dict[str, Any]:
    """The base model, then each LoRA adapter."""
    return {"object": "list", "data": [model_json(info), *(model_json(info, name) for name in info.lora_adapters)]}
