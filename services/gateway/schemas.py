"""TGI's HTTP request schemas: a JSON body in, a checked `TextRequest` out.

Types are checked field by field (a JSON body error is a 422 naming the field, as TGI answers
for bodies its JSON extractor rejects); ranges are checked by `ztgi.common.parameters`, the same
rules the tokenizer applies to direct clients. `null` means "the default" everywhere, as in TGI.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from typing import Any

from aiohttp import hdrs, web

from ztgi.common.messages import GenerateParameters
from ztgi.common.parameters import ParameterLimits, ValidationError, validate_best_of, validate_parameters
from ztgi.services.gateway.errors import HttpError
from ztgi.services.gateway.json_values import json_type
from ztgi.services.gateway.structured_output import parse_tgi_grammar

_INT_FIELDS = ("max_new_tokens", "top_k", "seed", "truncate", "top_n_tokens")
_FLOAT_FIELDS = ("temperature", "top_p", "typical_p", "repetition_penalty", "frequency_penalty",
                 "presence_penalty")  # the last is OpenAI's, accepted here as an extension
_BOOL_FIELDS = ("do_sample", "watermark", "details", "decoder_input_details", "return_full_text",
                "ignore_eos")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_MIN_INT, _MAX_INT = -(2**63), 2**64 - 1  # what msgpack carries (seeds are u64)


@dataclasses.dataclass(frozen=True)
class TextRequest:
    """A TGI generate request: the prompt, its parameters, and whether to stream."""

    inputs: str
    parameters: GenerateParameters
    stream: bool = False
    best_of: int = 1
    images: list[bytes] | None = None  # the files of the markdown images in `inputs` (vision models), loaded


async def read_json(request: web.Request, max_payload_bytes: int, read_timeout_s: float) -> Any:
    """The body as JSON: 415 for a body that says it is not JSON, 413 before reading anything
    larger than the limit, 408 for a body that does not arrive within `read_timeout_s` (a client
    that sends part of a body and stops holds a connection until then), 422 for bad JSON."""
    _check_json_content_type(request)
    if request.content_length is not None and request.content_length > max_payload_bytes:
        raise _too_large(max_payload_bytes)
    try:
        async with asyncio.timeout(read_timeout_s):
            body = await request.read()  # the app's client_max_size stops bodies without a length
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(max_payload_bytes) from None
    except TimeoutError:
        raise HttpError(408, f"the request body did not arrive within {read_timeout_s:g} s", "request_timeout",
                        close_connection=True) from None
    return parse_json(body)


def _check_json_content_type(request: web.Request) -> None:
    """TGI's JSON extractor answers 415 unless the body is declared JSON; a body with no
    Content-Type at all is read as JSON here (curl --data-binary, requests' data=)."""
    if hdrs.CONTENT_TYPE not in request.headers:
        return
    mime = request.content_type
    if mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json")):
        return
    raise HttpError(415, "Expected request with `Content-Type: application/json`", "unsupported_media_type")


def parse_json(body: bytes) -> Any:
    """UTF-8 JSON whose strings are all text; ValidationError (422) for anything else."""
    try:
        text = body.decode("utf-8")  # strict: json.loads(bytes) would let encoded surrogates through
        value = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationError("body", f"Failed to parse the request body as JSON: {exc}") from None
    except RecursionError:  # the C scanner recurses once per nesting level
        raise ValidationError("body", "Failed to parse the request body as JSON: nested too deeply") from None
    if _ESCAPED_SURROGATE.search(text) and not _all_text(value):
        raise ValidationError("body", "Failed to parse the request body as JSON: a string holds a lone "
                                      "UTF-16 surrogate (\\ud800-\\udfff), which is not text")
    return value


def _all_text(value: Any) -> bool:
    """Whether every string (key or value) encodes to UTF-8 (no lone surrogate)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
    return True


def _too_large(max_payload_bytes: int) -> HttpError:
    return HttpError(413, f"the request body is larger than the {max_payload_bytes} byte limit "
                          f"(--max-payload-bytes)", "payload_too_large")


def parse_text_request(body: Any, limits: ParameterLimits, stream: bool | None = None) -> TextRequest:
    """TGI's GenerateRequest (`stream` None: read it from the body, as `POST /` does)."""
    if not isinstance(body, dict):
        raise ValidationError("body", "the request body must be a JSON object")
    inputs = body.get("inputs")
    if inputs is None:
        raise ValidationError("inputs", "missing field `inputs`")
    if not isinstance(inputs, str):
        raise ValidationError("inputs", f"`inputs` must be a string, got {json_type(inputs)}")
    if not inputs:
        raise ValidationError("inputs", "`inputs` cannot be empty")
    if stream is None:
        stream = optional_value(body, "stream", bool, "a boolean") or False
    raw = body.get("parameters")
    if raw is not None and not isinstance(raw, dict):
        raise ValidationError("parameters", f"`parameters` must be an object, got {json_type(raw)}")
    parameters = parse_parameters(raw or {}, limits, stream)
    add_special_tokens = optional_value(body, "add_special_tokens", bool, "a boolean")
    if add_special_tokens is not None:
        parameters = dataclasses.replace(parameters, add_special_tokens=add_special_tokens)
    best_of = validate_best_of(optional_integer(raw or {}, "best_of"), parameters, limits, stream)
    return TextRequest(inputs, parameters, stream, best_of)


def parse_parameters(raw: dict[str, Any], limits: ParameterLimits, stream: bool) -> GenerateParameters:
    """TGI's `parameters` object, type-checked and validated against `limits`."""
    values: dict[str, Any] = {}
    for name in _INT_FIELDS:
        values[name] = optional_integer(raw, name)
    for name in _FLOAT_FIELDS:
        values[name] = optional_number(raw, name)
    for name in _BOOL_FIELDS:
        value = optional_value(raw, name, bool, "a boolean")
        if value is not None:
            values[name] = value
    values["stop"] = _stop_sequences(raw)
    values["grammar"] = parse_tgi_grammar(raw.get("grammar"))
    values["adapter_id"] = optional_name(raw, "adapter_id")
    parameters = GenerateParameters(**values)
    if stream and parameters.decoder_input_details:
        raise ValidationError("decoder_input_details",
                              "`decoder_input_details` == true is not supported when streaming tokens")
    validate_parameters(parameters, limits)
    return parameters


def _stop_sequences(raw: dict[str, Any]) -> list[str]:
    stop = raw.get("stop")
    if stop is None:
        return []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ValidationError("stop", f"`stop` must be an array of strings, got {json_type(stop)}")
    return stop


def optional_value(raw: dict[str, Any], name: str, kind: type, described: str) -> Any:
    value = raw.get(name)
    # bool is an int in Python, never in JSON
    if value is not None and (type(value) is not kind):
        raise ValidationError(name, f"`{name}` must be {described}, got {json_type(value)}")
    return value


def optional_name(raw: dict[str, Any], name: str) -> str | None:
    """A LoRA adapter's name (TGI's `adapter_id`): a non-empty string, or None when not given."""
    value = optional_value(raw, name, str, "a string")
    if value == "":
        raise ValidationError(name, f"`{name}` must be a non-empty string (an adapter's name), or null for the "
                                    f"base model")
    return value


def optional_integer(raw: dict[str, Any], name: str) -> int | None:
    value = optional_value(raw, name, int, "an integer")
    if value is not None and not _MIN_INT <= value <= _MAX_INT:
        raise ValidationError(name, f"`{name}` must fit in 64 bits. Given: {value}")
    return value


def optional_number(raw: dict[str, Any], name: str) -> float | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(name, f"`{name}` must be a number, got {json_type(value)}")
    return float(value)
