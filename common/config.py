"""Service configuration: one frozen dataclass per service, flags and env generated from it.

Each field becomes a `--flag-name` and an environment variable `ZTGI_FLAG_NAME`; precedence is
flag, then environment, then the field default. A config class validates itself in
`__post_init__` and raises `ConfigError` naming the bad value and what to change.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

ENV_PREFIX = "ZTGI_"

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


class ConfigError(ValueError):
    """An invalid configuration value; the message says which and what to change."""


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Adds one flag per field of `cls` (default None: unset flags fall back to env/default)."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__)
    for field in dataclasses.fields(cls):
        base = _base_type(hints[field.name])
        help_text = field.metadata.get("help", "")
        default = field.default if field.default is not dataclasses.MISSING else None
        help_text = f"{help_text} (env {env_name(field.name)}, default {default!r})".strip()
        if base is bool:
            group.add_argument(flag_name(field.name), dest=field.name, default=None,
                               action=argparse.BooleanOptionalAction, help=help_text)
        else:
            group.add_argument(flag_name(field.name), dest=field.name, default=None, help=help_text)


def config_from_namespace(cls: type[C], namespace: argparse.Namespace,
                          environ: typing.Mapping[str, str] | None = None) -> C:
    """Builds `cls` from parsed flags, then the environment, then defaults."""
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        raw = getattr(namespace, field.name, None)
        if raw is None and env_name(field.name) in environ:
            raw = environ[env_name(field.name)]
        if raw is not None:
            values[field.name] = _convert(field.name, hints[field.name], raw)
    return cls(**values)


def env_default(cls: type, field_name: str, environ: typing.Mapping[str, str] | None = None) -> Any:
    """Field `field_name` of `cls` as a config built without flags would hold it: its environment
    variable where set (converted as a flag's value), else its default."""
    environ = os.environ if environ is None else environ
    field = next(field for field in dataclasses.fields(cls) if field.name == field_name)
    if env_name(field_name) in environ:
        return _convert(field_name, typing.get_type_hints(cls)[field_name], environ[env_name(field_name)])
    return field.default


def parse_config(cls: type[C], argv: Sequence[str] | None = None, prog: str | None = None) -> C:
    parser = argparse.ArgumentParser(prog=prog, description=(cls.__doc__ or "").strip().split("\n")[0])
    add_config_arguments(parser, cls)
    return config_from_namespace(cls, parser.parse_args(argv))


def _base_type(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType) and len(args) == 1:
        return args[0]
    return tp


def _convert(name: str, tp: Any, raw: Any) -> Any:
    base = _base_type(tp)
    optional = base is not tp
    if not isinstance(raw, str):
        return raw
    if optional and raw.strip().lower() in ("", "none", "null"):
        return None
    try:
        if base is bool:
            return _parse_bool(raw)
        if base in (int, float, str):
            return base(raw)
    except ValueError:
        raise ConfigError(f"{flag_name(name)}={raw!r} is not a valid {base.__name__}") from None
    return raw


def _parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def require(condition: bool, message: str) -> None:
    """Raises ConfigError with `message` unless `condition` holds."""
    if not condition:
        raise ConfigError(message)
