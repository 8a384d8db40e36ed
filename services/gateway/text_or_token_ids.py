"""OpenAI's text-or-token-ids field, written once: `/v1/completions`' `prompt` and
`/v1/embeddings`' `input` take a string, an array of strings, an array of token ids, or an array of
arrays of token ids."""

from __future__ import annotations

from typing import Any

from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.json_values import json_type

MAX_TOKEN_ID = 2**31 - 1

TextOrTokenIds = str | list[int]


def text_or_token_ids(raw: Any, field: str, items: str) -> list[TextOrTokenIds]:
    """The field's entries, each checked; `items` names them in errors ("prompts", "inputs"). How
    many one request may hold is the caller's to check (each route words it its own way)."""
    if raw is None:
        raise ValidationError(field, f"missing field `{field}`")
    if isinstance(raw, list) and raw and all(_is_token_id(item) for item in raw):
        raw = [raw]  # one token-id entry
    entries = [raw] if isinstance(raw, str) else raw
    if not isinstance(entries, list) or not entries:
        raise ValidationError(field, f"`{field}` must be a non-empty string, an array of non-empty strings, "
                                     "an array of token ids or an array of arrays of token ids")
    for index, entry in enumerate(entries):
        _check_entry(entry, field, items, index)
    if len({isinstance(entry, str) for entry in entries}) > 1:
        raise ValidationError(field, f"`{field}` holds strings or token-id arrays, not a mix")
    return entries


def _check_entry(entry: Any, field: str, items: str, index: int) -> None:
    if isinstance(entry, str):
        if not entry:
            raise ValidationError(field, f"`{field}[{index}]` cannot be empty")
        return
    if not isinstance(entry, list) or not entry or not all(_is_token_id(value) for value in entry):
        raise ValidationError(field, f"`{field}[{index}]` must be a non-empty string or a non-empty array of "
                                     f"token ids (integers >= 0), got {json_type(entry)}; the {items} of one "
                                     f"request are all strings or all token-id arrays")


def _is_token_id(value: Any) -> bool:
    """An integer that may be a token id (the tokenizer checks it against its vocabulary)."""
    return type(value) is int and 0 <= value <= MAX_TOKEN_ID
