"""OpenAI's Responses API routes: POST /v1/responses, run as a chat completion; GET and DELETE
/v1/responses/{response_id} for the responses this gateway stores."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from ztgi.common.client.errors import ZtgiError
from ztgi.common.messages import StreamEvent
from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.errors import HttpError
from ztgi.services.gateway.openai_handlers import with_images
from ztgi.services.gateway.request_id import pipeline_request_id
from ztgi.services.gateway.responses_input import chat_messages
from ztgi.services.gateway.responses_render import ResponseFrame, new_item_id, output_items
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
    responses = dataclasses.replace(responses, chat=await with_images(request, responses.chat, "input"))
    frame = await _frame(request, responses)
    if responses.chat.stream:
        return await _stream_response(request, responses, frame)
    chat = responses.chat
    result = await request.app[CLIENT].generate(messages=chat.messages, parameters=chat.parameters, tools=chat.tools,
                                                request_id=pipeline_request_id(request))
    output = output_items(result.text, result.details, tools=chat.tools is not None)
    response = frame.response_json(output, result.details)
    _store(request, responses, response)
    return web.json_response(response)


async def retrieve_response(request: web.Request) -> web.Response:
    """GET /v1/responses/{response_id}: a response this gateway stores (`store: true`), else 404."""
    _refuse_query(request)
    stored = request.app[RESPONSE_STORE].get(request.match_info["response_id"])
    if stored is None:
        raise _not_stored(request.match_info["response_id"])
    return web.json_response(stored.response)


async def delete_response(request: web.Request) -> web.Response:
    """DELETE /v1/responses/{response_id}: forgets a stored response, else 404."""
    _refuse_query(request)
    response_id = request.match_info["response_id"]
    if not request.app[RESPONSE_STORE].delete(response_id):
        raise _not_stored(response_id)
    return web.json_response({"id": response_id, "object": "response", "deleted": True})


def _refuse_query(request: web.Request) -> None:
    """`stream` and `include` of a stored response are not served: refused, not ignored."""
    for name in request.query:
        raise ValidationError(name, f"`{name}` is not supported by this server on a stored response")


def _not_stored(response_id: str) -> HttpError:
    return HttpError(404, f"No response `{response_id}` is stored by this gateway (responses created with "
                          f"`store: true` are kept in its memory, the latest first)", "not_found")


async def _frame(request: web.Request, responses: ResponsesRequest) -> ResponseFrame:
    info = await request.app[SERVED_MODEL].info()
    return ResponseFrame(new_item_id("resp"), int(time.time()), info.model_id, responses.echoed)


def _store(request: web.Request, responses: ResponsesRequest, response: dict[str, Any]) -> None:
    """With `store: true`, the response and the conversation up to it."""
    if responses.store:
        request.app[RESPONSE_STORE].put(response, [*responses.turns, *chat_messages(response["output"], None)])


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
        if writer.final is not None:
            _store(request, responses, writer.final)
        return events

    def failure(error: ZtgiError) -> Iterable[NamedEvent]:
        return writer.fail(error)

    events = request.app[CLIENT].stream(messages=chat.messages, parameters=chat.parameters, tools=chat.tools,
                                        request_id=pipeline_request_id(request))
    return await serve_sse(request, events, render, failure=failure)
