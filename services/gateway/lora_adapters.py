"""vLLM's LoRA routes: POST /v1/load_lora_adapter and POST /v1/unload_lora_adapter.

The body is checked here, as vLLM does, with a 400 that names the field (nothing reaches the
scheduler); the scheduler then checks the adapter itself. Its refusals come back in OpenAI's error
shape with vLLM's statuses: a bad adapter 400, an unknown name 404, a name taken or still in use
409. Success is vLLM's plain-text sentence.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from ztgi.common.client.errors import ZtgiError
from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.errors import HttpError
from ztgi.services.gateway.json_values import json_type
from ztgi.services.gateway.schemas import read_json
from ztgi.services.gateway.state import CLIENT, CONFIG

ADAPTER_ERROR_TO_STATUS = {"validation": 400, "not_found": 404, "conflict": 409}
_IGNORED_FIELDS = frozenset({"lora_int_id"})  # vLLM's own numbering of adapters: the name is the key here


async def load_lora_adapter(request: web.Request) -> web.Response:
    """POST /v1/load_lora_adapter `{"lora_name", "lora_path"}`: the adapter is served under that name."""
    body = await _body(request, frozenset({"lora_name", "lora_path", "load_inplace"}))
    name, path = _string(body, "lora_name"), _string(body, "lora_path")
    if body.get("load_inplace") not in (None, False):
        raise _bad_request("`load_inplace` is not supported by this server: unload the adapter, then load it again")
    await _command(request.app[CLIENT].load_adapter(name, path))
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    """POST /v1/unload_lora_adapter `{"lora_name"}`: the adapter is no longer served."""
    body = await _body(request, frozenset({"lora_name"}))
    name = _string(body, "lora_name")
    await _command(request.app[CLIENT].unload_adapter(name))
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


async def _body(request: web.Request, fields: frozenset[str]) -> dict[str, Any]:
    """The JSON object, with no field but `fields` (and vLLM's ignored ones); 400 otherwise."""
    config = request.app[CONFIG]
    try:
        body = await read_json(request, config.max_payload_bytes, config.body_read_timeout_s)
    except ValidationError as exc:
        raise _bad_request(str(exc)) from None
    if not isinstance(body, dict):
        raise _bad_request(f"the request body must be a JSON object, got {json_type(body)}")
    unknown = sorted(set(body) - fields - _IGNORED_FIELDS)
    if unknown:
        raise _bad_request(f"unknown field `{unknown[0]}`: this route takes {', '.join(sorted(fields))}")
    return body


def _string(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if value is None:
        raise _bad_request(f"missing field `{name}`")
    if not isinstance(value, str) or not value:
        given = "an empty string" if value == "" else json_type(value)
        raise _bad_request(f"`{name}` must be a non-empty string, got {given}")
    return value


async def _command(command: Awaitable[None]) -> None:
    """Runs an adapter command; the scheduler's refusal becomes vLLM's status."""
    try:
        await command
    except ZtgiError as exc:
        status = ADAPTER_ERROR_TO_STATUS.get(exc.error_type)
        if status is None:
            raise  # unhealthy, cancelled: the error middleware's usual answer
        raise HttpError(status, exc.message, exc.error_type) from None


def _bad_request(message: str) -> HttpError:
    return HttpError(400, message, "validation")
