"""OpenAI's HTTP routes: /v1/chat/completions, /v1/completions, /v1/models (the base model and its LoRA
adapters)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Iterable
from typing import Any

from aiohttp import web

from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.common.client.generate_result import GenerateResult
from ztgi.common.messages import FinalDetails, GenerateParameters, InfoReply, StreamEvent
from ztgi.services.gateway import openai_render as render
from ztgi.services.gateway.best_of import sequence_logprob
from ztgi.services.gateway.completion_logprobs import CompletionLogprobs
from ztgi.services.gateway.errors import HttpError
from ztgi.services.gateway.openai_render import Envelope
from ztgi.services.gateway.openai_schemas import (
    OpenAIRequest,
    Prompt,
    parse_chat_request,
    parse_completion_request,
)
from ztgi.services.gateway.reasoning_grammar import with_reasoning_room
from ztgi.services.gateway.reasoning_parser import ReasoningSplit, ReasoningStream, split_reasoning
from ztgi.services.gateway.reasoning_start import reasoning_opened
from ztgi.services.gateway.request_id import pipeline_request_id, request_id
from ztgi.services.gateway.schemas import read_json
from ztgi.services.gateway.state import CLIENT, CONFIG, MEDIA_FETCHER, REASONING_START, SERVED_MODEL
from ztgi.services.gateway.stop_trim import StopTrimmer, trim_stop
from ztgi.services.gateway.streaming import gather_all, merge, serve_sse
from ztgi.services.gateway.tool_stream import ToolCallStream

DONE = "[DONE]"


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions: one chat completion, or its chunks as SSE."""
    config = request.app[CONFIG]
    chat = parse_chat_request(await read_json(request, config.max_payload_bytes, config.body_read_timeout_s),
                              config.limits, config.max_client_batch_size)
    chat = await with_images(request, chat)
    envelope = await _envelope(request, "chatcmpl")
    client = request.app[CLIENT]
    opened = await reasoning_opened(request.app.get(REASONING_START))
    if opened is not None:
        chat = with_reasoning_room(chat, opened)
    if chat.stream:
        return await _stream_chat(request, client, chat, envelope, opened)
    results = await gather_all(client.generate(messages=chat.messages, parameters=chat.choice_parameters(j),
                                               request_id=pipeline_request_id(request),
                                               tools=chat.tools)
                               for j in range(chat.n))
    results, reasonings = _without_reasoning(_without_stop(results, chat.parameters.stop), opened)
    return web.json_response(render.chat_completion_json(envelope, results, chat.logprobs, chat.tools is not None,
                                                         reasonings))


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions: `n` choices per prompt (prompt-major), or their chunks as SSE."""
    config = request.app[CONFIG]
    completion = parse_completion_request(
        await read_json(request, config.max_payload_bytes, config.body_read_timeout_s), config.limits,
        config.max_client_batch_size)
    envelope = await _envelope(request, "cmpl")
    client = request.app[CLIENT]
    if completion.stream:
        return await _stream_completion(request, client, completion, envelope)
    choices = _completion_choices(completion, completion.best_of)
    candidates = await gather_all(_generate(client, prompt, parameters, pipeline_request_id(request))
                                  for prompt, parameters in choices)
    results = _without_stop(_likeliest(candidates, completion.best_of, completion.n), completion.parameters.stop)
    if completion.score_only:
        results = [_without_generated(result) for result in results]
    assert completion.prompts is not None, "a completion request has prompts"
    prompts = [prompt for prompt in completion.prompts for _ in range(completion.n)]
    answers = [_completion_answer(completion, prompt, result, builder)
               for prompt, result, builder in zip(prompts, results, _completion_logprobs(completion))]
    return web.json_response(render.completion_json(envelope, [result for result, _ in answers],
                                                    [logprobs for _, logprobs in answers], completion.n))


async def models(request: web.Request) -> web.Response:
    """GET /v1/models: the served model, then its LoRA adapters (asked afresh: they come and go)."""
    return web.json_response(render.models_json(await request.app[CLIENT].info()))


async def model(request: web.Request) -> web.Response:
    """GET /v1/models/{model_id}: the served model or one of its LoRA adapters, or 404 for any other
    id (a slash in the id arrives percent-encoded, as the openai SDK sends it)."""
    info = await request.app[CLIENT].info()
    model_id = request.match_info["model_id"]
    if model_id == info.model_id:
        return web.json_response(render.model_json(info))
    if model_id in info.lora_adapters:
        return web.json_response(render.model_json(info, model_id))
    raise HttpError(404, f"The model `{model_id}` does not exist (this server serves `{info.model_id}`)",
                    "model_not_found")


async def with_images(request: web.Request, chat: OpenAIRequest, field: str = "messages") -> OpenAIRequest:
    """The chat with its image parts' files loaded (data: URLs decoded, allowed URLs fetched); an
    error names `field`, what the client sent the turns as."""
    assert chat.messages is not None, "a chat request has messages"
    messages = await request.app[MEDIA_FETCHER].resolve_messages(chat.messages, field)
    return dataclasses.replace(chat, messages=messages)


# -- helpers -----------------------------------------------------------------------------------

async def _envelope(request: web.Request, prefix: str) -> Envelope:
    info: InfoReply = await request.app[SERVED_MODEL].info()
    return Envelope(prefix, request_id(request), int(time.time()), info)


def _generate(client: AsyncZtgiClient, prompt: Prompt, parameters: GenerateParameters,
              pipeline_id: str) -> Awaitable[GenerateResult]:
    if isinstance(prompt, str):
        return client.generate(prompt, parameters=parameters, request_id=pipeline_id)
    return client.generate(input_ids=prompt, parameters=parameters, request_id=pipeline_id)


def _without_generated(result: GenerateResult) -> GenerateResult:
    """`max_tokens: 0`: the prefill's token is not part of the answer, which ends at its length (as vLLM)."""
    details = None if result.details is None else dataclasses.replace(result.details, generated_tokens=0,
                                                                         finish_reason="length")
    return dataclasses.replace(result, text="", tokens=[], top_tokens=[], details=details)


def _completion_answer(completion: OpenAIRequest, prompt: Prompt, result: GenerateResult,
                       builder: CompletionLogprobs | None) -> tuple[GenerateResult, dict[str, Any] | None]:
    """The choice's result and logprobs; with `echo` both begin with the prompt (a token-id
    prompt's text is its tokens' texts)."""
    if not completion.echo:
        return result, None if builder is None else builder.render(result.tokens, result.top_tokens)
    prefill = result.details.prefill if result.details is not None else []
    text = prompt if isinstance(prompt, str) else "".join("" if t.special else t.text for t in prefill)
    result = dataclasses.replace(result, text=text + result.text)
    if builder is None:
        return result, None
    prefill_top = [top.tokens for top in result.details.prefill_top_tokens] if result.details is not None else []
    prompt_logprobs = builder.render_prompt(prefill, prefill_top)
    return result, builder.concatenate(prompt_logprobs, builder.render(result.tokens, result.top_tokens))


def _completion_choices(completion: OpenAIRequest,
                        per_prompt: int | None = None) -> list[tuple[Prompt, GenerateParameters]]:
    """(prompt, parameters) of every choice (or `per_prompt` candidates of each prompt), in
    choice-index order: prompt-major, as OpenAI."""
    assert completion.prompts is not None, "a completion request has prompts"
    count = completion.n if per_prompt is None else per_prompt
    return [(prompt, completion.choice_parameters(j)) for prompt in completion.prompts for j in range(count)]


def _likeliest(candidates: list[GenerateResult], per_prompt: int, n: int) -> list[GenerateResult]:
    """`best_of`: of each prompt's `per_prompt` candidates, the `n` with the highest total token
    logprob, likeliest first (all of them, in order, when `per_prompt` is `n`)."""
    if per_prompt == n:
        return candidates
    chosen = []
    for first in range(0, len(candidates), per_prompt):
        group = candidates[first:first + per_prompt]
        chosen += sorted(group, key=sequence_logprob, reverse=True)[:n]
    return chosen


def _completion_logprobs(completion: OpenAIRequest) -> list[CompletionLogprobs | None]:
    """Each choice's legacy `logprobs` builder (None when not asked for); streamed with `echo`
    the offsets start after the prompt, which begins the text."""
    assert completion.prompts is not None, "a completion request has prompts"
    if not completion.logprobs:
        return [None] * (len(completion.prompts) * completion.n)
    num_top = completion.parameters.top_n_tokens or 0
    return [CompletionLogprobs(num_top, len(prompt) if completion.echo and completion.stream else 0)
            for prompt in completion.prompts for _ in range(completion.n)]


def _event_logprobs(builder: CompletionLogprobs | None, event: StreamEvent) -> dict[str, Any] | None:
    """A streamed token's legacy `logprobs` entries (None when not asked for)."""
    if builder is None or event.token is None:
        return None
    return builder.render([event.token], [event.top_tokens])


def _stopped(details: FinalDetails | None) -> bool:
    return details is not None and details.finish_reason == "stop_sequence"


def _without_stop(results: list[GenerateResult], stop: list[str]) -> list[GenerateResult]:
    """OpenAI's texts end before the stop sequence (the pipeline's end right after it)."""
    return [dataclasses.replace(r, text=trim_stop(r.text, stop, _stopped(r.details))) for r in results]


def _without_reasoning(results: list[GenerateResult],
                       opened: bool | None) -> tuple[list[GenerateResult], list[str] | None]:
    """With `--reasoning-parser` (`opened` not None): each result's content, and its reasoning."""
    if opened is None:
        return results, None
    splits = [split_reasoning(result.text, opened) for result in results]
    return [dataclasses.replace(r, text=split.content) for r, split in zip(results, splits)], \
        [split.reasoning for split in splits]


def _streamed_text(trimmer: StopTrimmer, event: StreamEvent) -> str:
    """The event's token text (none for special tokens), with stop sequences held back and left out."""
    text = "" if event.token is None or event.token.special else event.token.text
    return trimmer.feed(text, final=event.is_final, stopped=_stopped(event.details))


async def _stream_chat(request: web.Request, client: AsyncZtgiClient, chat: OpenAIRequest,
                       envelope: Envelope, opened: bool | None) -> web.StreamResponse:
    final: list[FinalDetails] = []
    trimmers = [StopTrimmer(chat.parameters.stop) for _ in range(chat.n)]
    calls = [ToolCallStream() for _ in range(chat.n)] if chat.tools is not None else None
    reasoners = None if opened is None else [ReasoningStream(opened) for _ in range(chat.n)]

    def chunks(item: tuple[int, StreamEvent]) -> Iterable[Any]:
        index, event = item
        if event.details is not None:
            final.append(event.details)
        split = ReasoningSplit(content=_streamed_text(trimmers[index], event))
        if reasoners is not None:
            split = reasoners[index].feed(split.content, final=event.is_final)
        if calls is None:
            chunk = render.chat_chunk_json(envelope, event, chat.logprobs, index, split.content)
        else:
            content, deltas = calls[index].feed(split.content, final=event.is_final)
            chunk = render.chat_tool_chunk_json(envelope, event, chat.logprobs, index, content, deltas,
                                                calls[index].num_calls)
        return [render.with_reasoning(chunk, split.reasoning)]

    def trailer() -> Iterable[Any]:
        usage = [render.chat_usage_chunk_json(envelope, final, chat.n)] if chat.include_usage and final else []
        return [*usage, DONE]

    streams = [client.stream(messages=chat.messages, parameters=chat.choice_parameters(j), tools=chat.tools,
                             request_id=pipeline_request_id(request))
               for j in range(chat.n)]
    return await serve_sse(request, merge(streams), chunks, trailer)


async def _stream_completion(request: web.Request, client: AsyncZtgiClient, completion: OpenAIRequest,
                             envelope: Envelope) -> web.StreamResponse:
    echoed: set[int] = set()
    final: list[FinalDetails] = []
    choices = _completion_choices(completion)
    trimmers = [StopTrimmer(completion.parameters.stop) for _ in choices]
    builders = _completion_logprobs(completion)

    def chunks(item: tuple[int, StreamEvent]) -> Iterable[Any]:
        index, event = item
        rendered = []
        if event.details is not None:
            final.append(event.details)
        if completion.echo and index not in echoed:
            echoed.add(index)
            prompt = choices[index][0]
            assert isinstance(prompt, str), "a token-id prompt's echo is not streamed"
            rendered.append(render.completion_echo_chunk_json(envelope, index, prompt))
        text = _streamed_text(trimmers[index], event)
        logprobs = _event_logprobs(builders[index], event)
        rendered.append(render.completion_chunk_json(envelope, index, event, logprobs, text))
        return rendered

    def trailer() -> Iterable[Any]:
        usage = [render.completion_usage_chunk_json(envelope, final, completion.n)] if completion.include_usage else []
        return [*usage, DONE]

    streams = [client.stream(prompt, parameters=parameters, request_id=pipeline_request_id(request))
               if isinstance(prompt, str) else
               client.stream(input_ids=prompt, parameters=parameters, request_id=pipeline_request_id(request))
               for prompt, parameters in choices]
    return await serve_sse(request, merge(streams), chunks, trailer)
