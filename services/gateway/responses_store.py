"""Stored responses (`store: true`): each Response object, for `GET /v1/responses/{id}`, and the
conversation up to it, for `previous_response_id`.

Kept in this gateway's memory only, least recently used first out: at most
`MAX_STORED_RESPONSES` responses and `MAX_STORED_CHARACTERS` characters of conversation in all.
A response is not kept across a restart, nor seen by another gateway of the same scheduler; a
`previous_response_id` this gateway does not hold is refused (422), never answered without it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any

from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.json_values import json_type

MAX_STORED_RESPONSES = 1024
MAX_STORED_CHARACTERS = 32 * 1024 * 1024

Turns = list[dict[str, Any]]
"""A conversation as chat messages (OpenAI chat dicts), without the instructions."""


@dataclasses.dataclass(frozen=True)
class StoredResponse:
    """A response as answered, and the conversation up to and including it."""

    response: dict[str, Any]
    turns: Turns
    num_characters: int


class ResponseStore:
    """Response id to its `StoredResponse`, LRU-bounded."""

    def __init__(self, max_responses: int = MAX_STORED_RESPONSES,
                 max_characters: int = MAX_STORED_CHARACTERS) -> None:
        self.max_responses = max_responses
        self.max_characters = max_characters
        self.num_characters = 0
        self.id_to_response: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()

    def put(self, response: dict[str, Any], turns: Turns) -> None:
        size = len(json.dumps([response, turns], ensure_ascii=False))
        if size > self.max_characters:
            return  # larger than the whole store: asking for it later is answered as for an unknown id
        self.id_to_response[response["id"]] = StoredResponse(response, turns, size)
        self.num_characters += size
        while len(self.id_to_response) > self.max_responses or self.num_characters > self.max_characters:
            _, evicted = self.id_to_response.popitem(last=False)
            self.num_characters -= evicted.num_characters

    def get(self, response_id: str) -> StoredResponse | None:
        stored = self.id_to_response.get(response_id)
        if stored is not None:
            self.id_to_response.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        stored = self.id_to_response.pop(response_id, None)
        if stored is not None:
            self.num_characters -= stored.num_characters
        return stored is not None

    def history(self, body: Any) -> Turns | None:
        """The conversation `body`'s `previous_response_id` continues (None without one)."""
        previous = body.get("previous_response_id") if isinstance(body, dict) else None
        if previous is None:
            return None
        if not isinstance(previous, str):
            raise ValidationError("previous_response_id",
                                  f"`previous_response_id` must be a string, got {json_type(previous)}")
        stored = self.get(previous)
        if stored is None:
            raise ValidationError("previous_response_id", f"`previous_response_id` {previous!r} is not a response "
                                                          f"this gateway stores: it keeps the latest responses "
                                                          f"created with `store: true`, in memory, for a while")
        return stored.turns
