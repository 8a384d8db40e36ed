"""The conversations of stored responses (`store: true`), for `previous_response_id`.

Kept in this gateway's memory only, least recently used first out: at most
`MAX_STORED_RESPONSES` responses and `MAX_STORED_CHARACTERS` characters of conversation in all.
A response is not kept across a restart, nor seen by another gateway of the same scheduler; a
`previous_response_id` this gateway does not hold is refused (422), never answered without it.
"""

from __future__ import annotations

import collections
import json
from typing import Any

from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.json_values import json_type

MAX_STORED_RESPONSES = 1024
MAX_STORED_CHARACTERS = 32 * 1024 * 1024

Turns = list[dict[str, Any]]
"""A conversation as chat messages (OpenAI chat dicts), without the instructions."""


class ResponseStore:
    """Response id to the conversation up to and including that response, LRU-bounded."""

    def __init__(self, max_responses: int = MAX_STORED_RESPONSES,
                 max_characters: int = MAX_STORED_CHARACTERS) -> None:
        self.max_responses = max_responses
        self.max_characters = max_characters
        self.num_characters = 0
        self.id_to_turns: collections.OrderedDict[str, tuple[Turns, int]] = collections.OrderedDict()

    def put(self, response_id: str, turns: Turns) -> None:
        size = len(json.dumps(turns, ensure_ascii=False))
        if size > self.max_characters:
            return  # larger than the whole store: following it up is refused as unknown
        self.id_to_turns[response_id] = (turns, size)
        self.num_characters += size
        while len(self.id_to_turns) > self.max_responses or self.num_characters > self.max_characters:
            _, (_, evicted) = self.id_to_turns.popitem(last=False)
            self.num_characters -= evicted

    def history(self, body: Any) -> Turns | None:
        """The conversation `body`'s `previous_response_id` continues (None without one)."""
        previous = body.get("previous_response_id") if isinstance(body, dict) else None
        if previous is None:
            return None
        if not isinstance(previous, str):
            raise ValidationError("previous_response_id",
                                  f"`previous_response_id` must be a string, got {json_type(previous)}")
        if previous not in self.id_to_turns:
            raise ValidationError("previous_response_id", f"`previous_response_id` {previous!r} is not a response "
                                                          f"this gateway stores: it keeps the latest responses "
                                                          f"created with `store: true`, in memory, for a while")
        self.id_to_turns.move_to_end(previous)
        return self.id_to_turns[previous][0]
