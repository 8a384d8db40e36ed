"""Anthropic's Messages routes: POST /v1/messages and /v1/messages/count_tokens.

A Messages request is parsed into the chat route's request (`anthropic_schemas`) and generated
the same way; only the answer's shape differs (`anthropic_render`, `anthropic_stream`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from ztgi.common.messages import StreamEvent
from ztgi.services.gateway.anthropic_render import answer_json
from ztgi.services.gateway.anthropic_schemas import (
    MessagesRequest,
    parse_count_tokens_request,
    parse_messages_request,
)
from ztgi.services.gateway.anthropic_stream import MessageStream, error_event
from ztgi.services.gateway.openai_handlers import with_images
from ztgi.services.gateway.reasoning_grammar import with_reasoning_room
from ztgi.services.gateway.reasoning_start import reasoning_opened
from ztgi.services.gateway.request_id import pipeline_request_id, request_id
from ztgi.services.gateway.schemas import read_json
from ztgi.services.gateway.state import CLIENT, CONFIG, REASONING_START, SERVED_MODEL
from ztgi.services.gateway.streaming import merge, serve_sse


async def messages(request: web.Request) -> web.StreamResponse:
    """POST /v1/messages: one message, or Anthropic's stream events of it."""
    config = request.app[CONFIG]
    body = await read_json(request, config.max_payload_bytes, config.body_read_timeout_s)
    parsed = parse_messages_request(body, config.limits, config.max_client_batch_size)
    parsed = dataclasses.replace(parsed, chat=await with_images(request, parsed.chat))
    model = (await request.app[SERVED_MODEL].info()).model_id
    message_id = f"msg_{request_id(request)}"
    opened = await reasoning_opened(request.app.get(REASONING_START))
    if opened is not None:
        parsed = dataclasses.replace(parsed, chat=with_reasoning_room(parsed.chat, opened))
    chat = parsed.chat
    if chat.stream:
        return await _stream(request, parsed, MessageStream(message_id, model, parsed.stop_sequences, opened,
                                                            chat.tools is not None))
    result = await request.app[CLIENT].generate(messages=chat.messages, parameters=chat.parameters, tools=chat.tools,
                                                request_id=pipeline_request_id(request))
    return web.json_response(answer_json(message_id, model, result, parsed.stop_sequences, opened,
                                         chat.tools is not None))


async def count_tokens(request: web.Request) -> web.Response:
    """POST /v1/messages/count_tokens: the prompt's tokens under the chat template."""
    config = request.app[CONFIG]
    chat = parse_count_tokens_request(await read_json(request, config.max_payload_bytes, config.body_read_timeout_s))
    chat = await with_images(request, chat)
    tokens = await request.app[CLIENT].tokenize("", messages=chat.messages)
    return web.json_response({"input_tokens": len(tokens)})


async def _stream(request: web.Request, parsed: MessagesRequest, stream: MessageStream) -> web.StreamResponse:
    chat = parsed.chat

    def events(item: tuple[int, StreamEvent]) -> Iterable[Any]:
        return stream.feed(item[1])

    generation = request.app[CLIENT].stream(messages=chat.messages, parameters=chat.parameters, tools=chat.tools,
                                            request_id=pipeline_request_id(request))
    return await serve_sse(request, merge([generation]), events,
                           failure=lambda exc: [error_event(exc.message, exc.error_type)])
