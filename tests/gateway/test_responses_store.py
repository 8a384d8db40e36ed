"""The bounded memory of stored responses (`ResponseStore`): what it keeps and what it forgets."""

from __future__ import annotations

import pytest

from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.responses_store import ResponseStore

TURN = [{"role": "user", "content": "Hi"}]


def response(response_id: str) -> dict:
    return {"id": response_id, "object": "response"}


def test_least_recently_used_response_goes_first() -> None:
    """Over `max_responses`, the response used least recently is forgotten."""
    store = ResponseStore(max_responses=2)
    store.put(response("resp_a"), TURN)
    store.put(response("resp_b"), TURN)
    assert store.history({"previous_response_id": "resp_a"}) == TURN  # a is now the most recent
    store.put(response("resp_c"), TURN)
    assert list(store.id_to_response) == ["resp_a", "resp_c"]
    with pytest.raises(ValidationError, match="resp_b"):
        store.history({"previous_response_id": "resp_b"})


def test_character_budget_bounds_the_store() -> None:
    """The responses kept add up to at most `max_characters`; one larger than that is not kept;
    a deleted one gives its room back."""
    size = len('[{"id": "resp_a", "object": "response"}, [{"role": "user", "content": "Hi"}]]')
    store = ResponseStore(max_characters=size * 2 - 1)
    store.put(response("resp_a"), TURN)
    store.put(response("resp_b"), TURN)
    assert list(store.id_to_response) == ["resp_b"] and store.num_characters == size
    store.put(response("resp_big"), [{"role": "user", "content": "x" * size * 2}])
    assert list(store.id_to_response) == ["resp_b"]
    assert store.delete("resp_b") and not store.delete("resp_b") and store.num_characters == 0


def test_no_previous_response_is_no_history() -> None:
    """Without `previous_response_id` there is nothing to continue; a wrong type is refused."""
    assert ResponseStore().history({"input": "Hi"}) is None
    with pytest.raises(ValidationError, match="must be a string"):
        ResponseStore().history({"previous_response_id": 5})
