"""OpenAI's Responses API route: POST /v1/responses, run as a chat completion."""

from __future__ import annotations

import time
from collections.abc import Iterable

from aiohttp import web

from ztgi.common.client.errors import ZtgiError
from ztgi.common.messages import StreamEvent
from ztgi.services.gateway.request_id import pipeline_request_id
from ztgi.services.gateway.responses_input import chat_messages
from ztgi.services.gateway.responses_render import Item, ResponseFrame, new_item_id, output_items
from ztgi.services.gateway.responses_schemas import ResponsesRequest, parse_responses_request
from ztgi.services.gateway.responses_stream import ResponseEvents
from ztgi.services.gateway.schemas import read_json
from ztgi.services.gateway.sse import NamedEvent
from ztgi.services.gateway.state import CLIENT, CONFIG, RESPONSE_STORE, SERVED_MODEL
from ztgi.services.gateway.streaming import serve_sse


async def create_response(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses: one Response object, or its events as SSE (`stream: true`)."""
    config = request.app[CONFIG]
    body = await read_json(request, config.max_payload_bytes, config.body_read_timeout_s)
    responses = parse_responses_request(body, config.limits, request.app[RESPONSE_STORE].history(body))
    frame = await _frame(request, responses)
    if responses.chat.stream:
        return await _stream_response(request, responses, frame)
    chat = responses.chat
    result = await request.app[CLIENT].generate(messages=chat.messages, parameters=chat.parameters, tools=chat.tools,
                                                request_id=pipeline_request_id(request))
    output = output_items(result.text, result.details, tools=chat.tools is not None)
    _store(request, responses, frame, output)
    return web.json_response(frame.response_json(output, result.details))


async def _frame(request: web.Request, responses: ResponsesRequest) -> ResponseFrame:
    info = await request.app[SERVED_MODEL].info()
    return ResponseFrame(new_item_id("resp"), int(time.time()), info.model_id, responses.echoed)


def _store(request: web.Request, responses: ResponsesRequest, frame: ResponseFrame, output: list[Item]) -> None:
    """With `store: true`, the conversation up to this answer, for a `previous_response_id`."""
    if responses.store:
        request.app[RESPONSE_STORE].put(frame.response_id, [*responses.turns, *chat_messages(output, None)])


async def _stream_response(request: web.Request, responses: ResponsesRequest,
                           frame: ResponseFrame) -> web.StreamResponse:
    chat = responses.chat
    writer = ResponseEvents(frame, tools=chat.tools is not None)
    started: list[bool] = []

    def render(event: StreamEvent) -> Iterable[NamedEvent]:
        """The response's first events come with the first token (an error before it is an HTTP error)."""
        first = [] if started else writer.start()
        started.append(True)
        events = [*first, *writer.feed(event)]
        if event.is_final:
            _store(request, responses, frame, writer.output)
        return events

    def failure(error: ZtgiError) -> Iterable[NamedEvent]:
        return writer.fail(error)

    events = request.app[CLIENT].stream(messages=chat.messages, parameters=chat.parameters, tools=chat.tools,
                                        request_id=pipeline_request_id(request))
    return await serve_sse(request, events, render, failure=failure)
