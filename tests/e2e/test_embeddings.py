"""`/v1/embeddings` through every process (the openai SDK as the client) on a launched random-weight
Qwen3 in float32: the vectors equal transformers' pooled final hidden states, beside a generation,
and every bad input is a clear 4xx."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import openai
import pytest
import requests
import torch
from openai.types import CreateEmbeddingResponse
from transformers import AutoModel, AutoTokenizer

from tests.e2e.server import LaunchedServer
from tests.worker.models.family_models import save_family_model
from ztgi.common.client.errors import ZtgiError
from ztgi.common.client.sync_client import ZtgiClient
from ztgi.common.messages import GenerateParameters

TEXTS = ["The capital of France is", "Hello",
         "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker"]
TOLERANCE = 1e-5
HIDDEN_SIZE = 64  # family_models' configs
MAX_INPUT_TOKENS = 64


@pytest.fixture(scope="module")
def qwen3_dir(smollm2: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_family_model("qwen3", str(tmp_path_factory.mktemp("qwen3")), smollm2.path)


@pytest.fixture(scope="module")
def server(qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    with mock.patch.dict(os.environ, {"ZTGI_MAX_CLIENT_BATCH_SIZE": "8"}):  # the gateway's; no launcher flag
        launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--model-id", qwen3_dir, "--dtype", "float32",
                                  "--max-input-tokens", str(MAX_INPUT_TOKENS), "--max-total-tokens", "128",
                                  startup_timeout_s=300)
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def client(server: LaunchedServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def expected(qwen3_dir: str) -> list[np.ndarray]:
    """transformers' last hidden state (after the final norm) at the last token, normalised."""
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    model = AutoModel.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    vectors = []
    with torch.no_grad():
        for text in TEXTS:
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            last = model(ids, output_hidden_states=True).hidden_states[-1][0, -1]
            vectors.append(torch.nn.functional.normalize(last, dim=0).numpy())
    return vectors


def _close(got: list[float] | np.ndarray, want: np.ndarray) -> bool:
    return float(np.max(np.abs(np.asarray(got, dtype=np.float32) - want))) < TOLERANCE


def test_sdk_embeddings_equal_transformers(client: openai.OpenAI, server: LaunchedServer,
                                           expected: list[np.ndarray]) -> None:
    """Three inputs of different lengths in one request: float and base64 (the SDK's default, which
    it decodes) both equal transformers' pooled states within 1e-5, in order; usage counts the prompts."""
    model = client.models.list().data[0].id
    floats = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    assert isinstance(floats, CreateEmbeddingResponse) and floats.model == model
    assert [item.index for item in floats.data] == [0, 1, 2]
    assert all(_close(item.embedding, want) for item, want in zip(floats.data, expected))
    decoded = client.embeddings.create(model=model, input=TEXTS)  # sent as base64, decoded by the SDK
    assert all(_close(item.embedding, want) for item, want in zip(decoded.data, expected))
    tokenizer = AutoTokenizer.from_pretrained(model)
    num_tokens = sum(len(tokenizer(text)["input_ids"]) for text in TEXTS)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == num_tokens
    raw = server.post("/v1/embeddings", {"model": model, "input": TEXTS, "encoding_format": "float"})
    CreateEmbeddingResponse.model_validate(raw.json())  # the SDK's own type, strictly (it parses leniently)
    raw = server.post("/v1/embeddings", {"model": model, "input": TEXTS[0], "encoding_format": "base64"})
    encoded = raw.json()["data"][0]["embedding"]  # the SDK's type declares floats; it passes base64 through as str
    assert _close(np.frombuffer(base64.b64decode(encoded), dtype="<f4"), expected[0])


def test_token_id_inputs_and_dimensions(client: openai.OpenAI, qwen3_dir: str, expected: list[np.ndarray]) -> None:
    """Token-id inputs embed as their text does; `dimensions` equal to the model's size is accepted,
    any other is refused for a model that does not declare Matryoshka training."""
    model = client.models.list().data[0].id
    ids = [AutoTokenizer.from_pretrained(qwen3_dir)(text)["input_ids"] for text in TEXTS[:2]]
    answer = client.embeddings.create(model=model, input=ids, encoding_format="float", dimensions=HIDDEN_SIZE)
    assert all(_close(item.embedding, want) for item, want in zip(answer.data, expected))
    single = client.embeddings.create(model=model, input=ids[0], encoding_format="float", user="someone")
    assert len(single.data) == 1 and _close(single.data[0].embedding, expected[0])
    with pytest.raises(openai.UnprocessableEntityError, match="Matryoshka"):
        client.embeddings.create(model=model, input="hi", dimensions=32)


def test_embedding_beside_a_generation(server: LaunchedServer, client: openai.OpenAI,
                                       expected: list[np.ndarray]) -> None:
    """Embedding requests sent while a streamed generation runs: the vectors are exact and the
    generation's greedy tokens are those it makes alone."""
    body = {"inputs": TEXTS[0], "parameters": {"max_new_tokens": 48, "ignore_eos": True}}
    alone = [token["id"] for token in _stream_tokens(server, body, None)]
    model = client.models.list().data[0].id
    answers: list[CreateEmbeddingResponse] = []

    def embed() -> None:
        answers.append(client.embeddings.create(model=model, input=TEXTS, encoding_format="float"))

    beside = [token["id"] for token in _stream_tokens(server, body, embed)]
    assert beside == alone
    assert all(_close(item.embedding, want) for item, want in zip(answers[0].data, expected))


def _stream_tokens(server: LaunchedServer, body: dict, after_first: Any) -> list[dict]:
    """The streamed tokens of /generate_stream; `after_first()` runs once the first has arrived."""
    tokens = []
    with requests.post(server.url + "/generate_stream", json=body, stream=True, timeout=120) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if not line.startswith(b"data:"):
                continue
            tokens.append(json.loads(line[5:])["token"])
            if len(tokens) == 1 and after_first is not None:
                after_first()
    return tokens


@pytest.mark.parametrize("body, status, words", [
    ({"input": ""}, 422, "cannot be empty"),
    ({"input": []}, 422, "non-empty"),
    ({"input": [[]]}, 422, "non-empty"),
    ({"input": ["a", [1, 2]]}, 422, "not a mix"),
    ({"input": [[1, "a"]]}, 422, "token ids"),
    ({"input": [[1, 2], [49152]]}, 422, "outside the vocabulary"),
    ({"input": "word " * 100}, 422, "longer than the 64 tokens this server embeds"),
    ({"input": ["a"] * 9}, 422, "max-client-batch-size"),
    ({"input": "hi", "encoding_format": "int8"}, 422, "float or base64"),
    ({"input": "hi", "dimensions": 0}, 422, "positive"),
    ({"input": "hi", "dimensions": 128}, 422, "Matryoshka"),
    ({"input": "hi", "pooling": "mean"}, 422, "unsupported field"),
    ({"input": "hi", "model": "gpt2"}, 404, "does not exist"),
    ({"input": "hi", "model": None}, 422, "model"),
])
def test_bad_input_is_a_clear_4xx(server: LaunchedServer, body: dict, status: int, words: str) -> None:
    """Each bad request is refused with its reason, and the server answers the next one."""
    model = server.get("/v1/models").json()["data"][0]["id"]
    response = server.post("/v1/embeddings", {"model": model, **body})
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]
    assert server.post("/v1/embeddings", {"model": model, "input": "hi"}).status_code == 200


def test_truncate_prompt_tokens_keeps_the_last_tokens(server: LaunchedServer, qwen3_dir: str) -> None:
    """An input longer than the model takes is embedded when the client asks to truncate it: as the
    last `truncate_prompt_tokens` ids alone."""
    model = server.get("/v1/models").json()["data"][0]["id"]
    ids = AutoTokenizer.from_pretrained(qwen3_dir)("word " * 100)["input_ids"]
    truncated = server.post("/v1/embeddings", {"model": model, "input": "word " * 100, "truncate_prompt_tokens": 16})
    tail = server.post("/v1/embeddings", {"model": model, "input": ids[-16:]})
    assert truncated.status_code == 200 and tail.status_code == 200, truncated.text
    assert truncated.json()["usage"]["prompt_tokens"] == 16
    assert truncated.json()["data"][0]["embedding"] == tail.json()["data"][0]["embedding"]


@pytest.mark.slow
def test_padded_engine_cannot_pool(qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """On the padded engine (no hidden states) an embeddings request is a 422 naming why, a direct
    client's embed request is refused by the scheduler the same way, and the server keeps generating."""
    server = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--model-id", qwen3_dir, "--dtype", "float32",
                            "--kv-cache", "padded", "--max-input-tokens", str(MAX_INPUT_TOKENS), "--max-total-tokens",
                            "128", startup_timeout_s=300)
    try:
        model = server.get("/v1/models").json()["data"][0]["id"]
        response = server.post("/v1/embeddings", {"model": model, "input": "hi"})
        assert response.status_code == 422 and "paged engine" in response.json()["error"]["message"], response.text
        with ZtgiClient(server.scheduler_url) as direct, pytest.raises(ZtgiError, match="paged engine"):
            direct.generate("hi", parameters=GenerateParameters(max_new_tokens=1, embed=True))
        assert server.post("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2}}).status_code == 200
    finally:
        assert server.stop() == 0, server.log
