"""msgpack codec for typed messages.

Every message is a frozen dataclass registered under an explicit tag with `@message("tag")`.
On the wire a message is the msgpack array `[tag, field_1, field_2, ...]`; nested records
(plain dataclasses used as field types) travel as arrays of their fields, in declaration order.
Decoding looks the tag up in the registry (never by reflection on names), checks the arity and
the type of every field against the class annotations, and builds the same class back.

Anything wrong with a message (not msgpack, truncated, unknown tag, wrong field count or type,
too large) raises `MessageError`, which every service logs and, where it knows the sender,
answers with an error.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform

import msgpack

MAX_MESSAGE_BYTES = 128 * 1024 * 1024
"""Frames larger than this are rejected before they are unpacked (ZMQ drops them unread)."""

MAX_IMAGE_BYTES_PER_MESSAGE = 96 * 1024 * 1024
"""What images may take of one frame: one request's files (gateway to scheduler), one request's pixel
tensors (tokenizer to scheduler), all of one Prefill's (scheduler to worker; a request alone may fill
it). The rest of the frame is room for its text and ids. SmolVLM's largest tiling of one image (17
tiles of 512 pixels in float32) is 53.5 MB."""


class MessageError(ValueError):
    """A frame that is not a valid message of this protocol."""


T = TypeVar("T")
U = TypeVar("U")
Checker = Callable[[Any], Any]

_TAG_TO_CLASS: dict[str, type] = {}
_CLASS_TO_TAG: dict[type, str] = {}
_RECORD_CHECKERS: dict[type, list[tuple[str, Checker]]] = {}
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """Declares a nested record: a frozen dataclass that travels as an array of its fields."""
    cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
    _RECORD_CHECKERS[cls] = []  # filled lazily: annotations may name classes defined later
    return cls


@dataclass_transform(frozen_default=True)
def message(tag: str) -> Callable[[type[T]], type[T]]:
    """Declares a top-level message type under `tag`."""

    def register(cls: type[T]) -> type[T]:
        if tag in _TAG_TO_CLASS:
            raise RuntimeError(f"message tag {tag!r} registered twice")
        cls = record(cls)
        _TAG_TO_CLASS[tag] = cls
        _CLASS_TO_TAG[cls] = tag
        return cls

    return register


def encode(msg: Any) -> bytes:
    """Encodes a registered message to bytes."""
    tag = _CLASS_TO_TAG.get(type(msg))
    if tag is None:
        raise TypeError(f"{type(msg).__name__} is not a registered message")
    return msgpack.packb([tag, *_fields_to_wire(msg)], use_bin_type=True)


@typing.overload
def decode(data: bytes, expected: type[T]) -> T: ...


@typing.overload
def decode(data: bytes, expected: tuple[type[T], type[U]]) -> T | U: ...


@typing.overload
def decode(data: bytes, expected: tuple[type, ...] | None = None) -> object: ...


def decode(data: bytes, expected: type | tuple[type, ...] | None = None) -> object:
    """Decodes bytes into a checked message; raises MessageError for anything malformed.

    With one `expected` class the result has its type; with several, match on it."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MessageError(f"expected a bytes frame, got {type(data).__name__}")
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"message of {len(data)} bytes exceeds the {MAX_MESSAGE_BYTES} byte limit")
    try:
        wire = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise MessageError(f"frame is not valid msgpack: {exc}") from None
    if not isinstance(wire, list) or not wire or not isinstance(wire[0], str):
        raise MessageError("frame is not a tagged message array")
    cls = _TAG_TO_CLASS.get(wire[0])
    if cls is None:
        raise MessageError(f"unknown message tag {wire[0]!r}")
    msg = _decode_fields(cls, wire[1:], wire[0])
    if expected is not None and not isinstance(msg, expected):
        raise MessageError(f"unexpected message {wire[0]!r} on this socket")
    return msg


@typing.overload
def decode_frames(frames: list[bytes], expected: type[T]) -> T: ...


@typing.overload
def decode_frames(frames: list[bytes], expected: tuple[type, ...]) -> object: ...


def decode_frames(frames: list[bytes], expected: type | tuple[type, ...]) -> object:
    """The checked message of a one-frame ZMQ message (`decode`); MessageError when it has
    several frames or its frame is malformed."""
    if len(frames) != 1:
        raise MessageError(f"expected a one-frame message, got {len(frames)} frames")
    return decode(frames[0], expected)


def tag_of(cls: type) -> str:
    return _CLASS_TO_TAG[cls]


# -- to the wire -----------------------------------------------------------------------------

def _fields_to_wire(obj: Any) -> list:
    names = _FIELD_NAMES.get(type(obj))
    if names is None:
        names = _FIELD_NAMES[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
    return [_to_wire(getattr(obj, name)) for name in names]


def _to_wire(value: Any) -> Any:
    if type(value) in _RECORD_CHECKERS:
        return _fields_to_wire(value)
    if type(value) is list and value and type(value[0]) in _RECORD_CHECKERS:
        return [_fields_to_wire(v) for v in value]
    return value


# -- from the wire ---------------------------------------------------------------------------
#
# Checkers take a value and return it (floats as float); a bad value raises _FieldError with
# what is wrong, and the path to it grows as the error leaves each record, so a valid message
# costs no string formatting and no exception.

class _FieldError(MessageError):
    """A bad value; `path` (".field", "[key]") is filled in on the way out."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.path: list[str] = []

    def located(self, where: str) -> MessageError:
        return MessageError(f"{where}{''.join(self.path)}: {self.detail}")


def _decode_fields(cls: type, values: Any, where: str) -> Any:
    try:
        return _build(cls, values)
    except _FieldError as exc:
        raise exc.located(where) from None


def _build(cls: type, values: Any) -> Any:
    if type(values) is not list:
        raise _FieldError(f"expected an array of fields, got {type(values).__name__}")
    checkers = _checkers_for(cls)
    if len(values) != len(checkers):
        raise _FieldError(f"expected {len(checkers)} fields, got {len(values)}")
    args = []
    for (name, check), value in zip(checkers, values):
        try:
            args.append(check(value))
        except _FieldError as exc:
            exc.path.insert(0, f".{name}")
            raise
    try:
        return cls(*args)
    except (TypeError, ValueError) as exc:  # __post_init__ validation
        raise _FieldError(str(exc)) from None


def _checkers_for(cls: type) -> list[tuple[str, Checker]]:
    checkers = _RECORD_CHECKERS[cls]
    if not checkers and dataclasses.fields(cls):
        hints = typing.get_type_hints(cls)
        checkers.extend((f.name, _checker(hints[f.name])) for f in dataclasses.fields(cls))
    return checkers


def _checker(tp: Any) -> Checker:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return lambda v: v
    if tp is float:
        return _check_float
    if tp is int:
        return _check_int
    if tp in (str, bool, bytes, type(None)):
        return _scalar_checker(tp)
    if tp in _RECORD_CHECKERS:
        return lambda v: _build(tp, v)
    if origin in (typing.Union, types.UnionType):
        return _union_checker(args)
    if origin is list:
        return _int_list_checker if args[0] is int else _list_checker(_checker(args[0]))
    if origin is dict:
        return _dict_checker(_checker(args[0]), _checker(args[1]))
    if origin is typing.Literal:
        return _literal_checker(args)
    raise TypeError(f"unsupported message field type {tp!r}")


def _scalar_checker(tp: type) -> Checker:
    def check(value: Any) -> Any:
        if type(value) is not tp:
            raise _FieldError(f"expected {tp.__name__}, got {type(value).__name__}")
        return value

    return check


def _check_int(value: Any) -> int:
    # bool is an int subclass: keep the two apart in both directions
    if type(value) is not int and (not isinstance(value, int) or isinstance(value, bool)):
        raise _FieldError(f"expected int, got {type(value).__name__}")
    return value


def _check_float(value: Any) -> float:
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _FieldError(f"expected float, got {type(value).__name__}")
    return float(value)


def _union_checker(types_: tuple) -> Checker:
    """`X | None` checks None first; the other options are tried in order."""
    options = [_checker(tp) for tp in types_ if tp is not type(None)]
    optional = len(options) < len(types_)

    def check(value: Any) -> Any:
        if value is None and optional:
            return None
        for option in options:
            try:
                return option(value)
            except _FieldError:
                continue
        raise _FieldError(f"value of type {type(value).__name__} matches no allowed type")

    return check


def _list_checker(item: Checker) -> Checker:
    def check(value: Any) -> list:
        if type(value) is not list:
            raise _FieldError(f"expected array, got {type(value).__name__}")
        return [item(v) for v in value]

    return check


def _int_list_checker(value: Any) -> list:
    """Fast path for token id arrays, the bulk of most messages."""
    if type(value) is not list or not all(type(v) is int for v in value):
        raise _FieldError("expected an array of integers")
    return value


def _dict_checker(key: Checker, val: Checker) -> Checker:
    def check(value: Any) -> dict:
        if type(value) is not dict:
            raise _FieldError(f"expected map, got {type(value).__name__}")
        checked = {}
        for k, v in value.items():
            try:
                checked[key(k)] = val(v)
            except _FieldError as exc:
                exc.path.insert(0, f"[{k!r}]")
                raise
        return checked

    return check


def _literal_checker(allowed: tuple) -> Checker:
    allows_bool = any(isinstance(a, bool) for a in allowed)

    def check(value: Any) -> Any:
        if value not in allowed or isinstance(value, bool) != allows_bool:
            raise _FieldError(f"{value!r} is not one of {list(allowed)}")
        return value

    return check
