"""TGI's HTTP routes: parse the body, call the client, render the answer.

Errors travel as exceptions to `errors.error_middleware`; streams are served by
`streaming.serve_sse` (errors before the first token are HTTP errors, later ones a last event).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Any

from aiohttp import web

from ztgi.services.gateway import render
from ztgi.services.gateway.best_of import BestOf, generate_best_of
from ztgi.services.gateway.errors import HttpError
from ztgi.services.gateway.request_id import pipeline_request_id
from ztgi.services.gateway.schemas import TextRequest, parse_text_request, read_json
from ztgi.services.gateway.state import CLIENT, CONFIG, MEDIA_FETCHER, SERVED_MODEL
from ztgi.services.gateway.streaming import serve_sse
from ztgi.services.gateway.vllm_tokenize import (
    TokenizeRequest,
    is_vllm_tokenize,
    parse_detokenize_request,
    parse_tokenize_request,
)

logger = logging.getLogger(__name__)


async def generate(request: web.Request) -> web.Response:
    """POST /generate: the whole generation as one JSON object."""
    return await _generate_json(request, await _text_request(request, stream=False))


async def generate_stream(request: web.Request) -> web.StreamResponse:
    """POST /generate_stream: one SSE event per token, the last with the text and details."""
    return await _generate_sse(request, await _text_request(request, stream=True))


async def compat_generate(request: web.Request) -> web.StreamResponse:
    """POST /: `/generate` wrapped in a list (TGI's api-inference shape), or a stream."""
    text_request = await _text_request(request, stream=None)
    if text_request.stream:
        return await _generate_sse(request, text_request)
    return await _generate_json(request, text_request, wrap_in_list=True)


async def invocations(request: web.Request) -> web.StreamResponse:
    """POST /invocations: SageMaker's route, served as `POST /`."""
    return await compat_generate(request)


async def health(request: web.Request) -> web.Response:
    """GET /health: 200 when the scheduler says it can serve, else 503 with its reason."""
    reply = await request.app[CLIENT].health()
    if not reply.healthy:
        raise HttpError(503, reply.reason, "healthcheck")
    return web.Response(status=200)


async def info(request: web.Request) -> web.Response:
    """GET /info: TGI's Info."""
    reply = await request.app[CLIENT].info()
    return web.json_response(render.info_json(reply, request.app[CONFIG]))


async def tokenize(request: web.Request) -> web.Response:
    """POST /tokenize: TGI's TokenizeResponse (ids, texts, character offsets) from a tokenizer,
    or vLLM's answer to its form (`prompt` or `messages`)."""
    config = request.app[CONFIG]
    body = await read_json(request, config.max_payload_bytes, config.body_read_timeout_s)
    if is_vllm_tokenize(body):
        return await _vllm_tokenize(request, parse_tokenize_request(body))
    text_request = parse_text_request(body, config.limits, stream=False)
    parameters = text_request.parameters
    tokens = await request.app[CLIENT].tokenize(text_request.inputs, parameters.add_special_tokens, parameters.truncate)
    return web.json_response([{"id": t.id, "text": t.text, "start": t.start, "stop": t.stop} for t in tokens])


async def detokenize(request: web.Request) -> web.Response:
    """POST /detokenize (vLLM's): `{"tokens": [...]}` to `{"prompt": text}`."""
    config = request.app[CONFIG]
    ids = parse_detokenize_request(await read_json(request, config.max_payload_bytes, config.body_read_timeout_s))
    return web.json_response({"prompt": await request.app[CLIENT].detokenize(ids)})


async def ping(request: web.Request) -> web.Response:
    """GET /ping: the gateway itself is up (asks nothing of the scheduler)."""
    return web.Response(status=200)


# -- helpers -----------------------------------------------------------------------------------

async def _text_request(request: web.Request, stream: bool | None) -> TextRequest:
    config = request.app[CONFIG]
    text_request = parse_text_request(await read_json(request, config.max_payload_bytes, config.body_read_timeout_s),
                                      config.limits, stream)
    return dataclasses.replace(text_request, images=await _markdown_images(request, text_request.inputs))


async def _markdown_images(request: web.Request, inputs: str) -> list[bytes] | None:
    """The files of the markdown images in `inputs` for a vision model; a text model's prompt is text,
    markdown images included (as TGI reads them)."""
    if "![" not in inputs or not (await request.app[SERVED_MODEL].info()).vision:
        return None
    return await request.app[MEDIA_FETCHER].inputs_images(inputs)


async def _vllm_tokenize(request: web.Request, query: TokenizeRequest) -> web.Response:
    messages = None if query.messages is None else await request.app[MEDIA_FETCHER].resolve_messages(query.messages)
    tokens = await request.app[CLIENT].tokenize(query.prompt or "", query.add_special_tokens, messages=messages)
    info = await request.app[SERVED_MODEL].info()
    return web.json_response({"count": len(tokens), "max_model_len": info.max_total_tokens,
                              "tokens": [t.id for t in tokens],
                              "token_strs": [t.text for t in tokens] if query.return_token_strs else None})


async def _generate_json(request: web.Request, text_request: TextRequest,
                         wrap_in_list: bool = False) -> web.Response:
    started = time.monotonic()
    client = request.app[CLIENT]
    if text_request.best_of > 1:
        chosen = await generate_best_of(client, text_request.inputs, text_request.parameters, text_request.best_of,
                                        text_request.images)
    else:
        chosen = BestOf(await client.generate(text_request.inputs, parameters=text_request.parameters,
                                              request_id=pipeline_request_id(request),
                                              images=text_request.images), [])
    result = chosen.best
    body: Any = render.generate_response(result, text_request.parameters, chosen.others)
    headers = render.timing_headers(result, text_request.inputs, time.monotonic() - started,
                                    request.app[CONFIG].compute_type)
    return web.json_response([body] if wrap_in_list else body, headers=headers)


async def _generate_sse(request: web.Request, text_request: TextRequest) -> web.StreamResponse:
    events = request.app[CLIENT].stream(text_request.inputs, parameters=text_request.parameters,
                                        request_id=pipeline_request_id(request), images=text_request.images)
    indexes = itertools.count(1)  # TGI counts stream events from 1
    headers = {"x-compute-type": request.app[CONFIG].compute_type,
               "x-compute-characters": str(len(text_request.inputs))}
    return await serve_sse(
        request, events, lambda event: [render.stream_event_json(event, next(indexes))],
        headers=headers)
