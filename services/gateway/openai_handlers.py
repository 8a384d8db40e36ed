"""OpenAI's HTTP routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.common.client.generate_result import GenerateResult
from ztgi.common.messages import FinalDetails, GenerateParameters, InfoReply, StreamEvent
from ztgi.services.gateway import openai_render as render
from ztgi.services.gateway.best_of import sequence_logprob
from ztgi.services.gateway.completion_logprobs import CompletionLogprobs
from ztgi.services.gateway.openai_render import Envelope
from ztgi.services.gateway.openai_schemas import OpenAIRequest, parse_chat_request, parse_completion_request
from ztgi.services.gateway.schemas import read_json
from ztgi.services.gateway.state import CLIENT, CONFIG, SERVED_MODEL
from ztgi.services.gateway.stop_trim import StopTrimmer, trim_stop
from ztgi.services.gateway.streaming import gather_all, merge, serve_sse
from ztgi.services.gateway.tool_stream import ToolCallStream

DONE = "[DONE]"


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions: one chat completion, or its chunks as SSE."""
    config = request.app[CONFIG]
    chat = parse_chat_request(await read_json(request, config.max_payload_bytes, config.body_read_timeout_s),
                              config.limits, config.max_client_batch_size)
    envelope = await _envelope(request, "chatcmpl")
    client = request.app[CLIENT]
    if chat.stream:
        return await _stream_chat(request, client, chat, envelope)
    results = await gather_all(client.generate(messages=chat.messages, parameters=chat.choice_parameters(j),
                                               tools=chat.tools)
                               for j in range(chat.n))
    results = _without_stop(results, chat.parameters.stop)
    return web.json_response(render.chat_completion_json(envelope, results, chat.logprobs, chat.tools is not None))


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
    candidates = await gather_all(
        client.generate(prompt, parameters=dataclasses.replace(parameters, return_full_text=completion.echo))
        for prompt, parameters in _completion_choices(completion, completion.best_of))
    results = _without_stop(_likeliest(candidates, completion.best_of, completion.n), completion.parameters.stop)
    logprobs = [None if builder is None else builder.render(result.tokens, result.top_tokens)
                for builder, result in zip(_completion_logprobs(completion), results)]
    return web.json_response(render.completion_json(envelope, results, logprobs, completion.n))


async def models(request: web.Request) -> web.Response:
    """GET /v1/models: the one served model."""
    return web.json_response(render.models_json(await request.app[SERVED_MODEL].info()))


# -- helpers -----------------------------------------------------------------------------------

async def _envelope(request: web.Request, prefix: str) -> Envelope:
    info: InfoReply = await request.app[SERVED_MODEL].info()
    return Envelope(prefix, uuid.uuid4().hex, int(time.time()), info)


def _completion_choices(completion: OpenAIRequest,
                        per_prompt: int | None = None) -> list[tuple[str, GenerateParameters]]:
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
    """Each choice's legacy `logprobs` builder (None when not asked for); with `echo` the
    offsets start after the prompt, which begins the text."""
    assert completion.prompts is not None, "a completion request has prompts"
    if not completion.logprobs:
        return [None] * (len(completion.prompts) * completion.n)
    num_top = completion.parameters.top_n_tokens or 0
    return [CompletionLogprobs(num_top, len(prompt) if completion.echo else 0)
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


def _streamed_text(trimmer: StopTrimmer, event: StreamEvent) -> str:
    """The event's token text (none for special tokens), with stop sequences held back and left out."""
    text = "" if event.token is None or event.token.special else event.token.text
    return trimmer.feed(text, final=event.is_final, stopped=_stopped(event.details))


async def _stream_chat(request: web.Request, client: AsyncZtgiClient, chat: OpenAIRequest,
                       envelope: Envelope) -> web.StreamResponse:
    final: list[FinalDetails] = []
    trimmers = [StopTrimmer(chat.parameters.stop) for _ in range(chat.n)]
    calls = [ToolCallStream() for _ in range(chat.n)] if chat.tools is not None else None

    def chunks(item: tuple[int, StreamEvent]) -> Iterable[Any]:
        index, event = item
        if event.details is not None:
            final.append(event.details)
        text = _streamed_text(trimmers[index], event)
        if calls is None:
            return [render.chat_chunk_json(envelope, event, chat.logprobs, index, text)]
        content, deltas = calls[index].feed(text, final=event.is_final)
        return [render.chat_tool_chunk_json(envelope, event, chat.logprobs, index, content, deltas,
                                            calls[index].num_calls)]

    def trailer() -> Iterable[Any]:
        usage = [render.chat_usage_chunk_json(envelope, final, chat.n)] if chat.include_usage and final else []
        return [*usage, DONE]

    streams = [client.stream(messages=chat.messages, parameters=chat.choice_parameters(j), tools=chat.tools)
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
            rendered.append(render.completion_echo_chunk_json(envelope, index, prompt))
        text = _streamed_text(trimmers[index], event)
        logprobs = _event_logprobs(builders[index], event)
        rendered.append(render.completion_chunk_json(envelope, index, event, logprobs, text))
        return rendered

    def trailer() -> Iterable[Any]:
        usage = [render.completion_usage_chunk_json(envelope, final, completion.n)] if completion.include_usage else []
        return [*usage, DONE]

    streams = [client.stream(prompt, parameters=parameters) for prompt, parameters in choices]
    return await serve_sse(request, merge(streams), chunks, trailer)
