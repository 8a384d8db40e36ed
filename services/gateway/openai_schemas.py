"""OpenAI's request schemas (chat completions, completions) to `GenerateParameters`, TGI's way.

As in TGI: temperature 0 means greedy, any other (or none) samples; completions default to
100 new tokens; `suffix` is refused. `logit_bias` ({"token id": -100..100}) is added to the
logits in the worker's chooser; OpenAI fields the server does not implement are refused (422).
`response_format` and `tools` become a grammar (`structured_output`); assistant `tool_calls` and
`tool` turns are carried back to the template. `image_url` content parts make the turn's `parts`
(text and images in order; `content` is then its text alone), loaded by `media_fetch`.
`top_p: 1.0` (OpenAI's "off") is treated as unset, and so is any `top_p` with temperature 0 (as
vLLM: TGI would sample then).
`model` names a LoRA adapter to generate with (vLLM's way), any other name the base model (TGI's way).
`n` choices are `n` requests (choice `j` of a seeded request uses `seed + j`); choices of all
prompts together are bounded by `max_client_batch_size`. A completion's `best_of` (OpenAI, vLLM)
generates that many candidates per prompt, the same way, and returns the `n` with the highest
total token logprob; it must be >= `n`, counts against `max_client_batch_size` as `n` does, and is
refused when streaming, greedy (every candidate would be the same) or with `echo`.
A completion's prompt is text or token ids (one list, or a list of lists: evaluation harnesses
send those). `echo` with `logprobs` asks for the prompt's own logprobs (`decoder_input_details`),
and `max_tokens: 0` with `echo` scores the prompt only: the request runs as one prefill whose
token is left out of the answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ztgi.common.messages import ChatMessage, ContentPart, GenerateParameters, Grammar, TokenBias, Tool, ToolCall
from ztgi.common.parameters import MAX_SEED, ParameterLimits, ValidationError, validate_parameters
from ztgi.services.gateway.image_inputs import pending_image
from ztgi.services.gateway.schemas import json_type, optional_integer, optional_number, optional_value
from ztgi.services.gateway.structured_output import parse_response_format, parse_tool_use
from ztgi.services.gateway.text_or_token_ids import TextOrTokenIds, text_or_token_ids

COMPLETION_MAX_NEW_TOKENS = 100
"""TGI's default for /v1/completions when `max_tokens` is not given."""

_UNSUPPORTED_CHAT_FIELDS = ("functions", "function_call", "audio", "prediction", "web_search_options",
                            "reasoning_effort")
"""OpenAI chat fields this server does not implement: refused, never silently ignored (as
`suffix` on /v1/completions)."""


Prompt = TextOrTokenIds
"""A completion prompt: text, or token ids."""


@dataclasses.dataclass(frozen=True)
class OpenAIRequest:
    """A chat (`messages`) or completion (`prompts`) request, with how to answer it."""

    parameters: GenerateParameters
    messages: list[ChatMessage] | None = None
    prompts: list[Prompt] | None = None
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    echo: bool = False
    n: int = 1
    best_of: int = 1  # completions: candidates generated per prompt, the `n` likeliest returned (>= n)
    tools: list[Tool] | None = None  # rendered into the prompt; the answer is read for tool calls
    score_only: bool = False  # `max_tokens: 0` with `echo`: the prompt's logprobs, no generated token

    def choice_parameters(self, choice: int) -> GenerateParameters:
        """Parameters of choice `choice` of one prompt: its own seed when a seed is given."""
        if self.parameters.seed is None or choice == 0:
            return self.parameters
        return dataclasses.replace(self.parameters, seed=(self.parameters.seed + choice) % (MAX_SEED + 1))


def parse_chat_request(body: Any, limits: ParameterLimits, max_client_batch_size: int = 1) -> OpenAIRequest:
    """POST /v1/chat/completions."""
    body = _object(body)
    for name in _UNSUPPORTED_CHAT_FIELDS:
        if body.get(name) is not None:
            raise ValidationError(name, f"`{name}` is not supported by this server")
    if body.get("modalities") not in (None, ["text"]):
        raise ValidationError("modalities", "`modalities` other than [\"text\"] are not supported by this server")
    logprobs = optional_value(body, "logprobs", bool, "a boolean") or False
    top_logprobs = _num_top_logprobs(body, "top_logprobs", limits)
    if top_logprobs and not logprobs:  # OpenAI and vLLM refuse it rather than answer without them
        raise ValidationError("top_logprobs", "`logprobs` must be true when `top_logprobs` is used")
    max_tokens = _max_tokens(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _max_tokens(body, "max_tokens")
    response_format = parse_response_format(body.get("response_format"))
    tool_use = parse_tool_use(body, response_format)
    grammar = tool_use.grammar if tool_use is not None else response_format
    parameters = _parameters(body, limits, max_tokens, details=logprobs,
                             top_n_tokens=top_logprobs if logprobs else None, grammar=grammar)
    return OpenAIRequest(parameters, messages=_messages(body.get("messages")), stream=_stream(body),
                         include_usage=_include_usage(body), logprobs=logprobs,
                         n=_num_choices(body, 1, max_client_batch_size),
                         tools=tool_use.tools if tool_use is not None else None)


def parse_completion_request(body: Any, limits: ParameterLimits, max_client_batch_size: int) -> OpenAIRequest:
    """POST /v1/completions (several prompts become several requests, one choice each).

    The legacy `logprobs` is a number N: every token's logprob and, when N > 0, its N likeliest
    alternatives (TGI's `top_n_tokens`); with `echo`, the prompt's tokens' too.
    """
    body = _object(body)
    if body.get("suffix") is not None:
        raise ValidationError("suffix", "Suffix is not supported and can be achieved by preprocessing the prompt.")
    prompts = _prompts(body.get("prompt"), max_client_batch_size)
    echo = optional_value(body, "echo", bool, "a boolean") or False
    n = _num_choices(body, len(prompts), max_client_batch_size)
    if echo and n > 1:
        raise ValidationError("echo", "`echo` is not supported with `n` > 1")
    max_tokens = _max_tokens(body, "max_tokens", allow_zero=echo)
    score_only = max_tokens == 0
    num_logprobs = _num_top_logprobs(body, "logprobs", limits)
    stream = _stream(body)
    token_ids = not isinstance(prompts[0], str)
    if stream and echo and (score_only or token_ids):
        raise ValidationError("echo", "`echo` of a token-id prompt, or with `max_tokens: 0`, is answered whole: "
                                      "send it with `stream: false`")
    prompt_details = echo and not stream and (num_logprobs is not None or token_ids)
    parameters = _parameters(body, limits, COMPLETION_MAX_NEW_TOKENS if max_tokens is None else max(max_tokens, 1),
                             details=num_logprobs is not None, top_n_tokens=num_logprobs or None)
    parameters = dataclasses.replace(parameters, decoder_input_details=prompt_details)
    best_of = _best_of(body, n, len(prompts), max_client_batch_size, parameters, stream)
    if echo and best_of > n:
        raise ValidationError("best_of", "`best_of` is not supported with `echo`")
    return OpenAIRequest(parameters, prompts=prompts, stream=stream, include_usage=_include_usage(body),
                         logprobs=num_logprobs is not None, echo=echo, n=n, score_only=score_only, best_of=best_of)


def _num_top_logprobs(body: dict[str, Any], name: str, limits: ParameterLimits) -> int | None:
    """How many alternatives per token `name` asks for, checked here so the error names `name`
    (it travels as `top_n_tokens`)."""
    value = optional_integer(body, name)
    if value is not None and not 0 <= value <= limits.max_top_n_tokens:
        raise ValidationError(name, f"`{name}` must be >= 0 and <= {limits.max_top_n_tokens} "
                                    f"(--max-top-n-tokens). Given: {value}")
    return value


def _max_tokens(body: dict[str, Any], name: str, allow_zero: bool = False) -> int | None:
    """`max_tokens` or `max_completion_tokens`, checked here so that the error names the field
    sent (it travels as `max_new_tokens`); 0 only where it means "score the prompt" (`echo`)."""
    value = optional_integer(body, name)
    if value == 0 and allow_zero:
        return value
    if value is not None and value <= 0:
        hint = " (0 is accepted with `echo`: the prompt scored, nothing generated)" if name == "max_tokens" else ""
        raise ValidationError(name, f"`{name}` must be strictly positive{hint}. Given: {value}")
    return value


def _parameters(body: dict[str, Any], limits: ParameterLimits, max_new_tokens: int | None, details: bool,
                top_n_tokens: int | None, grammar: Grammar | None = None) -> GenerateParameters:
    temperature = optional_number(body, "temperature")
    top_p = optional_number(body, "top_p")
    parameters = GenerateParameters(
        max_new_tokens=max_new_tokens,
        temperature=None if temperature == 0.0 else temperature,
        do_sample=temperature != 0.0,
        top_p=None if top_p == 1.0 else top_p,
        seed=optional_integer(body, "seed"),
        frequency_penalty=optional_number(body, "frequency_penalty"),
        presence_penalty=optional_number(body, "presence_penalty"),
        repetition_penalty=optional_number(body, "repetition_penalty"),
        stop=_stop(body.get("stop")),
        details=details,
        top_n_tokens=top_n_tokens,
        grammar=grammar,
        logit_bias=_logit_bias(body.get("logit_bias")),
        model=_model(body),
    )
    validate_parameters(parameters, limits)
    if not parameters.do_sample:
        # a top_p would turn sampling back on (TGI samples when any warper is set); the argmax
        # is the same without it, so greedy stays greedy
        parameters = dataclasses.replace(parameters, top_p=None)
    return parameters


def _model(body: dict[str, Any]) -> str | None:
    """OpenAI's `model`, for the scheduler: a LoRA adapter's name selects it (vLLM's way); any other
    name, or none, means the base model (TGI's leniency)."""
    return optional_value(body, "model", str, "a string") or None


def _logit_bias(raw: Any) -> list[TokenBias] | None:
    """OpenAI's `logit_bias`: {"token id": bias}; the ranges are checked with the other parameters,
    the ids against the vocabulary by the tokenizer."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValidationError("logit_bias", f"`logit_bias` must be an object mapping token ids to numbers, "
                                            f"got {json_type(raw)}")
    entries = []
    for key, value in raw.items():
        if not (key.isascii() and key.isdigit()) or len(key) > 10:
            raise ValidationError("logit_bias", f"`logit_bias` keys must be token ids (integers >= 0). Given: {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValidationError("logit_bias", f"`logit_bias` values must be numbers, got {json_type(value)} "
                                                f"for token {key}")
        entries.append(TokenBias(int(key), float(value)))
    return entries or None


def _num_choices(body: dict[str, Any], num_prompts: int, max_client_batch_size: int) -> int:
    n = optional_integer(body, "n")
    if n is None:
        return 1
    max_n = max(1, max_client_batch_size // num_prompts)
    if not 1 <= n <= max_n:
        raise ValidationError("n", f"`n` must be >= 1 and <= {max_n} (--max-client-batch-size "
                                   f"{max_client_batch_size} choices per request). Given: {n}")
    return n


def _best_of(body: dict[str, Any], n: int, num_prompts: int, max_client_batch_size: int,
             parameters: GenerateParameters, stream: bool) -> int:
    """Candidates per prompt (`n` when unset); ValidationError naming `best_of` when it cannot be served."""
    best_of = optional_integer(body, "best_of")
    if best_of is None or best_of == n:
        return n
    max_best_of = max(1, max_client_batch_size // num_prompts)
    if not n <= best_of <= max_best_of:
        raise ValidationError("best_of", f"`best_of` must be >= `n` ({n}) and <= {max_best_of} "
                                         f"(--max-client-batch-size {max_client_batch_size} candidates per "
                                         f"request). Given: {best_of}")
    if stream:
        raise ValidationError("best_of", "`best_of` > `n` is not supported when streaming")
    if not parameters.do_sample:
        raise ValidationError("best_of", "`best_of` > `n` needs sampling (temperature > 0): greedy "
                                         "candidates are all the same")
    return best_of


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValidationError("body", "the request body must be a JSON object")
    return body


def parse_messages(raw: Any) -> list[ChatMessage]:
    """OpenAI's `messages`, checked (image parts still URLs: `MediaFetcher.resolve_messages`)."""
    return _messages(raw)


def _messages(raw: Any) -> list[ChatMessage]:
    if raw is None:
        raise ValidationError("messages", "missing field `messages`")
    if not isinstance(raw, list) or not raw:
        raise ValidationError("messages", "`messages` must be a non-empty array of messages")
    return [_message(item, index) for index, item in enumerate(raw)]


def _message(item: Any, index: int) -> ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(item, dict):
        raise ValidationError("messages", f"`{where}` must be an object, got {json_type(item)}")
    role = item.get("role")
    if not isinstance(role, str) or not role:
        raise ValidationError("messages", f"`{where}.role` must be a non-empty string")
    tool_calls = _tool_calls(item.get("tool_calls"), where) if role == "assistant" else None
    tool_call_id = item.get("tool_call_id") if role == "tool" else None
    if role == "tool" and not isinstance(tool_call_id, str):
        raise ValidationError("messages", f"`{where}.tool_call_id` must be the id of the call it answers")
    content, parts = _content(item.get("content"), where, has_tool_calls=bool(tool_calls))
    return ChatMessage(role, content, tool_calls, tool_call_id, parts)


def _tool_calls(raw: Any, where: str) -> list[ToolCall] | None:
    """An assistant turn's `tool_calls`: [{"id", "type": "function", "function": {"name", "arguments"}}]."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ValidationError("messages", f"`{where}.tool_calls` must be an array")
    calls = []
    for index, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(function, dict) or not isinstance(call.get("id"), str)
                or not isinstance(function.get("name"), str) or not isinstance(function.get("arguments"), str)):
            raise ValidationError("messages", f"`{where}.tool_calls[{index}]` must be {{\"id\": string, \"type\": "
                                              f"\"function\", \"function\": {{\"name\": string, "
                                              f"\"arguments\": string}}}}")
        calls.append(ToolCall(call["id"], function["name"], function["arguments"]))
    return calls or None


def _content(content: Any, where: str, has_tool_calls: bool) -> tuple[str, list[ContentPart] | None]:
    """OpenAI content (a string, or an array of text and `image_url` parts) as the turn's text and,
    when it holds an image, all its parts in order (each image still a URL: `image_inputs`)."""
    if content is None and has_tool_calls:
        return "", None
    if isinstance(content, str):
        return content, None
    if not isinstance(content, list):
        raise ValidationError("messages", f"`{where}.content` must be a string or an array of parts")
    parts = [_part(part, f"{where}.content[{index}]") for index, part in enumerate(content)]
    text = "".join(part.text for part in parts if part.type == "text")
    return text, parts if any(part.type == "image" for part in parts) else None


def _part(part: Any, where: str) -> ContentPart:
    """A text part, or an image part: `{"type": "image_url", "image_url": {"url": ...}}` (OpenAI) or
    `"image_url": "<url>"` (vLLM accepts it too)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return ContentPart("text", text=part["text"])
    if kind == "image_url":
        image_url = part.get("image_url")
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
        if isinstance(url, str) and url:
            return pending_image(url)
        raise ValidationError("messages", f"`{where}.image_url` must be {{\"url\": \"data:image/png;base64,...\" "
                                          f"or an http(s) URL}}")
    raise ValidationError("messages", f"`{where}` must be a text part ({{\"type\": \"text\", \"text\": ...}}) or an "
                                      f"image part ({{\"type\": \"image_url\", \"image_url\": {{\"url\": ...}}}})")


def _prompts(raw: Any, max_client_batch_size: int) -> list[Prompt]:
    prompts = text_or_token_ids(raw, "prompt", "prompts")
    if len(prompts) > max_client_batch_size:
        raise ValidationError("prompt", f"Number of prompts exceeds the maximum allowed batch size of "
                                        f"{max_client_batch_size}")
    return prompts


def _stop(raw: Any) -> list[str]:
    if raw is None:
        return []
    stop = [raw] if isinstance(raw, str) else raw
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ValidationError("stop", f"`stop` must be a string or an array of strings, got {json_type(raw)}")
    return stop


def _stream(body: dict[str, Any]) -> bool:
    return optional_value(body, "stream", bool, "a boolean") or False


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise ValidationError("stream_options", "`stream_options` must be an object")
    return optional_value(options, "include_usage", bool, "a boolean") or False
