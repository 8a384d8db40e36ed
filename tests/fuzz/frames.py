"""Hypothesis strategies for hostile ZMQ frames: random bytes, truncated and mistyped messages.

`wire_message()` builds a message of any registered tag from its class annotations, the way the
codec reads them, so it is well-formed msgpack that is valid, of the wrong type for the socket,
or out of range (negative ids, huge numbers, NaN). `frame()` mixes it with raw bytes, truncated
encodings, arbitrary msgpack and wrong arities; `multipart()` sends one to three of those.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import msgpack
from hypothesis import strategies as st

from ztgi.common import (
    codec,
    messages,  # noqa: F401  (registers every message tag)
)

INT64 = st.one_of(st.integers(-3, 40), st.integers(-(2**63), 2**64 - 1))
FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)
SMALL_TEXT = st.text(max_size=16)
RAW_MSGPACK = st.recursive(
    st.none() | st.booleans() | INT64 | FLOATS | SMALL_TEXT | st.binary(max_size=16),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(SMALL_TEXT, children, max_size=3),
    max_leaves=12)


def _value(tp: Any, depth: int = 0) -> st.SearchStrategy:
    """A wire value of the annotated type (records become arrays of their fields)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return RAW_MSGPACK
    if tp is bool:
        return st.booleans()
    if tp is int:
        return INT64
    if tp is float:
        return FLOATS
    if tp is str:
        return st.text(max_size=24)
    if tp is bytes:
        return st.binary(max_size=24)
    if tp is type(None):
        return st.none()
    if dataclasses.is_dataclass(tp):
        return _record(tp, depth + 1)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([_value(a, depth) for a in args])
    if origin is list:
        return st.lists(_value(args[0], depth + 1), max_size=3 if depth < 3 else 0)
    if origin is dict:
        return st.dictionaries(_value(args[0], depth + 1), _value(args[1], depth + 1), max_size=2)
    if origin is typing.Literal:
        return st.sampled_from(args)
    raise TypeError(f"no strategy for {tp!r}")


def _record(cls: type, depth: int) -> st.SearchStrategy:
    hints = typing.get_type_hints(cls)
    return st.tuples(*[_value(hints[f.name], depth) for f in dataclasses.fields(cls)]).map(list)


@st.composite
def wire_message(draw: st.DrawFn, tags: tuple[str, ...] = ()) -> list:
    """[tag, *fields] of a random registered message type (one of `tags` when given)."""
    tag = draw(st.sampled_from(sorted(tags or codec._TAG_TO_CLASS)))
    return [tag, *draw(_record(codec._TAG_TO_CLASS[tag], 0))]


@st.composite
def _mutated(draw: st.DrawFn) -> list:
    """A message with a field dropped, added or replaced by anything."""
    wire = draw(wire_message())
    how = draw(st.sampled_from(["drop", "add", "replace"]))
    if how == "drop" and len(wire) > 1:
        return wire[:-1]
    if how == "add":
        return wire + [draw(RAW_MSGPACK)]
    index = draw(st.integers(1, max(1, len(wire) - 1)))
    return wire[:index] + [draw(RAW_MSGPACK)] + wire[index + 1:]


def _pack(wire: Any) -> bytes:
    return msgpack.packb(wire, use_bin_type=True)


@st.composite
def _truncated(draw: st.DrawFn) -> bytes:
    data = _pack(draw(wire_message()))
    return data[:draw(st.integers(0, max(0, len(data) - 1)))]


def tags_of(*classes: type) -> tuple[str, ...]:
    return tuple(codec.tag_of(cls) for cls in classes)


def frame(tags: tuple[str, ...] = ()) -> st.SearchStrategy[bytes]:
    """One hostile frame; `tags`: the messages the receiving socket expects, drawn more often,
    so that well-formed ones with hostile values (negative ids, unknown keys) reach the handlers."""
    expected = [wire_message(tags).map(_pack)] * 2 if tags else []
    return st.one_of(
        *expected,
        st.binary(max_size=64),
        wire_message().map(_pack),
        _mutated().map(_pack),
        _truncated(),
        RAW_MSGPACK.map(_pack),
    )


def multipart(tags: tuple[str, ...] = ()) -> st.SearchStrategy[list[bytes]]:
    """A message of one to three hostile frames (one most often)."""
    return st.one_of(frame(tags).map(lambda f: [f]), frame(tags).map(lambda f: [f]),
                     st.lists(frame(tags), min_size=2, max_size=3))
