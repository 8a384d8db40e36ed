"""The embeddings request's checks and answer, apart from sockets: what the gateway refuses before
anything runs, and `dimensions` on a Matryoshka model."""

from __future__ import annotations

import base64
import dataclasses

import numpy as np
import pytest

from ztgi.common.client.generate_result import GenerateResult
from ztgi.common.messages import FinalDetails, InfoReply
from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.embedding_request import check_servable, parse_embedding_request
from ztgi.services.gateway.embeddings import embeddings_json
from ztgi.services.gateway.errors import HttpError

INFO = InfoReply(query_id="q", model_id="m", model_dtype="float32", model_device_type="cpu",
                 max_concurrent_requests=1, max_best_of=1, max_stop_sequences=1, max_input_tokens=8,
                 max_total_tokens=16, max_batch_total_tokens=16, max_batch_prefill_tokens=16, max_waiting_tokens=1,
                 max_batch_size=None, waiting_served_ratio=1.0, num_workers=1, num_tokenizers=1, version="0",
                 kv_cache="paged", pooling="last", hidden_size=4, matryoshka=True)


def _result(vector: list[float], input_tokens: int) -> GenerateResult:
    details = FinalDetails("length", 1, input_tokens, embedding=np.asarray(vector, dtype="<f4").tobytes())
    return GenerateResult("r", "", [], [], details)


def test_matryoshka_dimensions_truncate_and_renormalise():
    """`dimensions` 2 of a Matryoshka model: the first two values, unit length again, in floats and in
    base64; usage adds every input's prompt tokens."""
    results = [_result([0.6, 0.0, 0.8, 0.0], 3), _result([0.5, 0.5, 0.5, 0.5], 2)]
    request = parse_embedding_request({"model": "m", "input": ["a", "b"], "dimensions": 2}, 4)
    check_servable(request, INFO)
    answer = embeddings_json(request, INFO, results)
    assert answer["data"][0]["embedding"] == [1.0, 0.0]
    assert answer["data"][1]["embedding"] == pytest.approx([2 ** -0.5, 2 ** -0.5])
    assert answer["usage"] == {"prompt_tokens": 5, "total_tokens": 5} and answer["model"] == "m"
    request = dataclasses.replace(request, encoding_format="base64")
    encoded = embeddings_json(request, INFO, results)["data"][1]["embedding"]
    assert np.frombuffer(base64.b64decode(encoded), dtype="<f4") == pytest.approx([2 ** -0.5, 2 ** -0.5])


def test_what_the_model_cannot_give_is_refused():
    """More dimensions than the model has, any other size on a model without Matryoshka, a model that
    cannot pool, and another model's id: each refused naming why."""
    request = parse_embedding_request({"model": "m", "input": "a", "dimensions": 8}, 4)
    with pytest.raises(ValidationError, match="at most 4"):
        check_servable(request, INFO)
    with pytest.raises(ValidationError, match="Matryoshka"):
        check_servable(dataclasses.replace(request, dimensions=2), dataclasses.replace(INFO, matryoshka=False))
    check_servable(dataclasses.replace(request, dimensions=4), dataclasses.replace(INFO, matryoshka=False))
    with pytest.raises(ValidationError, match="padded"):
        check_servable(request, dataclasses.replace(INFO, pooling=None, pooling_error="the padded engine..."))
    with pytest.raises(HttpError, match="does not exist"):
        check_servable(dataclasses.replace(request, model="gpt2"), INFO)


@pytest.mark.parametrize("body, words", [
    ([], "JSON object"),
    ({"model": "m"}, "missing field `input`"),
    ({"model": "m", "input": [[1], ["a"]]}, "token ids"),
    ({"model": "m", "input": [1, -1]}, "token ids"),
    ({"model": "m", "input": "a", "user": 1}, "`user` must be a string"),
    ({"model": "m", "input": "a", "truncate_prompt_tokens": 0}, "positive"),
    ({"model": "m", "input": "a", "add_special_tokens": "yes"}, "boolean"),
])
def test_bad_requests_name_the_field(body, words):
    """Malformed bodies are ValidationErrors (422) naming what is wrong."""
    with pytest.raises(ValidationError, match=words):
        parse_embedding_request(body, 4)


def test_a_request_is_one_prefill_per_input():
    """Each input becomes an embed request of one new token, carrying truncation and special tokens."""
    request = parse_embedding_request({"model": "m", "input": [1, 2, 3], "truncate_prompt_tokens": 2,
                                       "add_special_tokens": False}, 4)
    assert request.inputs == [[1, 2, 3]]
    parameters = request.parameters
    assert parameters.embed and parameters.max_new_tokens == 1 and parameters.truncate == 2
    assert not parameters.add_special_tokens
