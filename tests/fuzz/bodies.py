"""Hypothesis strategies for hostile HTTP requests: routes, methods, content types, bodies.

Bodies are raw bytes, broken JSON, JSON of any shape, and near-valid requests of each API with
one field replaced by something hostile: huge or negative numbers, NaN and Infinity (Python's
JSON extensions), deep nesting, unicode edge cases (lone surrogates, NUL, right-to-left marks,
invalid UTF-8), long strings, wrong types.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

TGI_POST_ROUTES = ("/", "/generate", "/generate_stream", "/invocations", "/tokenize")
OPENAI_POST_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings",
                      "/v1/load_lora_adapter", "/v1/unload_lora_adapter")
GET_ROUTES = ("/health", "/info", "/ping", "/metrics", "/v1/models", "/v1/responses/resp_0")
ODD_ROUTES = ("/nope", "/v1/nope", "/generate/", "//generate", "/%ff%fe", "/v1/chat/completions/x", "/v1")
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
CONTENT_TYPES = (None, "application/json", "application/json; charset=latin-1", "text/plain",
                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/msgpack",
                 "\u00e9/\u00e9")

TGI_PARAMETERS = ("max_new_tokens", "temperature", "top_k", "top_p", "typical_p", "do_sample", "seed",
                  "repetition_penalty", "frequency_penalty", "presence_penalty", "watermark", "stop", "truncate",
                  "details", "decoder_input_details", "top_n_tokens", "return_full_text", "best_of", "grammar",
                  "adapter_id")
OPENAI_FIELDS = ("model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop", "seed",
                 "stream", "stream_options", "logprobs", "top_logprobs", "frequency_penalty",
                 "presence_penalty", "echo", "suffix", "tools", "response_format", "user")
RESPONSES_FIELDS = ("model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "text", "tools",
                    "tool_choice", "parallel_tool_calls", "metadata", "store", "previous_response_id", "stream",
                    "truncation", "include", "reasoning")

EDGE_TEXT = st.sampled_from(["", " ", "\x00", "\ud800", "\udfff", "\u202e\u202d", "\ufeff", "\U0001f600" * 50,
                             "a" * 5000, "\u0301" * 100, "\r\n\r\n", "data: x\n\n", "</s><|im_end|>", "{{ x }}",
                             "%s%n", "\\u0000"])
TEXT = st.one_of(st.text(max_size=40), EDGE_TEXT)
NUMBERS = st.one_of(
    st.integers(-5, 70), st.sampled_from([0, -1, 2**31, 2**53 + 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-320, -0.0, 1.5, 1e308]))
JSON = st.recursive(st.none() | st.booleans() | NUMBERS | TEXT,
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
                    max_leaves=10)


def deep(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


@st.composite
def _with_hostile_field(draw: st.DrawFn, base: dict[str, Any], fields: tuple[str, ...],
                        nested: str | None = None) -> Any:
    body = dict(base)
    target = body.setdefault(nested, {}) if nested and draw(st.booleans()) else body
    for name in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3)):
        target[name] = draw(JSON)
    return body


def tgi_body() -> st.SearchStrategy[Any]:
    base = {"inputs": "Hello", "parameters": {"max_new_tokens": 3}}
    return st.one_of(_with_hostile_field(base, ("inputs", "parameters", "stream", "add_special_tokens"), None),
                     _with_hostile_field(base, TGI_PARAMETERS, "parameters"))


def chat_body() -> st.SearchStrategy[Any]:
    message = st.fixed_dictionaries({"role": st.one_of(st.just("user"), JSON), "content": st.one_of(TEXT, JSON)})
    return st.one_of(
        _with_hostile_field({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}, OPENAI_FIELDS),
        st.builds(lambda messages: {"messages": messages, "max_tokens": 3}, st.lists(message, max_size=3)))


def completion_body() -> st.SearchStrategy[Any]:
    return _with_hostile_field({"prompt": "Hi", "max_tokens": 3}, ("prompt", *OPENAI_FIELDS))


def responses_body() -> st.SearchStrategy[Any]:
    item = st.fixed_dictionaries({"type": st.sampled_from(["message", "function_call", "function_call_output"]),
                                  "role": st.one_of(st.just("user"), JSON), "content": st.one_of(TEXT, JSON),
                                  "call_id": JSON, "name": JSON, "arguments": JSON, "output": JSON})
    return st.one_of(
        _with_hostile_field({"input": "Hi", "max_output_tokens": 3}, RESPONSES_FIELDS),
        _with_hostile_field({"input": "Hi", "max_output_tokens": 3, "text": {"format": {"type": "json_schema"}}},
                            ("name", "schema", "strict", "type"), "text"),
        st.builds(lambda items: {"input": items, "max_output_tokens": 3}, st.lists(item, max_size=3)))


def embedding_body() -> st.SearchStrategy[Any]:
    return _with_hostile_field({"input": "Hi", "model": "any"},
                               ("input", "model", "encoding_format", "dimensions", "user", "truncate_prompt_tokens"))


def lora_body() -> st.SearchStrategy[Any]:
    """A load (or unload: the path is then an unknown field) of an adapter in no directory."""
    return _with_hostile_field({"lora_name": "fuzz", "lora_path": "/nonexistent/fuzz-lora"},
                               ("lora_name", "lora_path", "lora_int_id", "load_inplace"))


def _encode(value: Any, ensure_ascii: bool) -> bytes:
    text = json.dumps(value, allow_nan=True, ensure_ascii=ensure_ascii)
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate becomes invalid UTF-8


@st.composite
def body(draw: st.DrawFn, route: str) -> bytes:
    """A hostile body for `route`."""
    near_valid = chat_body() if route.endswith("chat/completions") else (
        completion_body() if route.endswith("/completions") else
        responses_body() if route.endswith("/responses") else
        embedding_body() if route.endswith("/embeddings") else
        lora_body() if route.endswith("_lora_adapter") else tgi_body())
    kind = draw(st.sampled_from(["near_valid", "near_valid", "json", "raw", "broken", "deep", "big"]))
    if kind == "near_valid":
        return _encode(draw(near_valid), draw(st.booleans()))
    if kind == "json":
        return _encode(draw(JSON), draw(st.booleans()))
    if kind == "raw":
        return draw(st.binary(max_size=200))
    if kind == "broken":
        text = _encode(draw(near_valid), True)
        return text[:draw(st.integers(0, max(0, len(text) - 1)))]
    if kind == "deep":
        depth = draw(st.sampled_from([100, 1000, 10_000, 30_000]))
        inner = deep(depth)
        return draw(st.sampled_from([inner, '{"inputs": ' + inner + "}", '{"inputs": "Hi", "parameters": '
                                     + "{\"a\":" * depth + "1" + "}" * depth + "}"])).encode()
    return b'{"inputs": "' + b"x" * draw(st.sampled_from([65_000, 70_000, 300_000])) + b'"}'


@st.composite
def request(draw: st.DrawFn, excluded: tuple[str, ...] = ()) -> dict[str, Any]:
    """method, path, query, headers, body of one hostile request (to any route but `excluded`)."""
    group = draw(st.sampled_from([TGI_POST_ROUTES, OPENAI_POST_ROUTES, TGI_POST_ROUTES, OPENAI_POST_ROUTES,
                                  GET_ROUTES, ODD_ROUTES]))  # mostly the routes that read a body
    path = draw(st.sampled_from([route for route in group if route not in excluded]))
    post = path in TGI_POST_ROUTES + OPENAI_POST_ROUTES
    method = "POST" if post and draw(st.integers(0, 9)) else draw(st.sampled_from(METHODS))
    query = draw(st.one_of(st.just(""), st.text(max_size=30).map(lambda q: q.replace("#", ""))))
    content_type = draw(st.sampled_from(CONTENT_TYPES))
    headers = {} if content_type is None else {"Content-Type": content_type}
    data = draw(body(path)) if method in ("POST", "PUT", "PATCH") else b""
    return {"method": method, "path": path, "query": query, "headers": headers, "body": data}
