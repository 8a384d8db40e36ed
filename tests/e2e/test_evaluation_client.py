"""What evaluation harnesses send to /v1/completions (lm-evaluation-harness's `local-completions`
with its defaults: token-id prompts, `echo`, `logprobs: 1`, `max_tokens: 1`), answered by a
launched ztgi serving SmolLM2 in float32 and compared with transformers' own prompt logprobs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.e2e.server import LaunchedServer
from ztgi.common.model_source import ModelSource

CONTEXT = "Question: What is the capital of France?\nAnswer:"
CONTINUATIONS = [" Paris", " London", " a large city in the north"]
TOLERANCE = 1e-3  # lm-eval's float32 comparison; the figures agree far closer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--dtype", "float32", "--quantize", "none")
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def tokenizer(smollm2: ModelSource) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2.path)


@pytest.fixture(scope="module")
def reference(smollm2: ModelSource) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2.path, dtype=torch.float32).eval()


def reference_logprobs(model: Any, ids: list[int]) -> tuple[list[float], list[int]]:
    """Each token's logprob given those before it (from the second), and the argmax at each position."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1)
    return logprobs.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist(), logprobs.argmax(-1).tolist()


def lm_eval_scores(choice: dict[str, Any], context_len: int) -> tuple[float, bool]:
    """lm-eval's `local-completions` parse_logprobs: the continuation's summed logprob and is_greedy."""
    token_logprobs = choice["logprobs"]["token_logprobs"][context_len:-1]
    top_logprobs = choice["logprobs"]["top_logprobs"][context_len:-1]
    is_greedy = all(logprob == max(top.values()) for logprob, top in zip(token_logprobs, top_logprobs))
    return sum(token_logprobs), is_greedy


def test_lm_eval_loglikelihood_requests_match_transformers(server: LaunchedServer, tokenizer: Any,
                                                           reference: Any) -> None:
    """One batched request of token-id prompts (lm-eval's shape) scores each continuation as
    transformers does, prompt token by prompt token, and the likeliest continuation wins."""
    context_ids = tokenizer.encode(CONTEXT)
    prompts = [context_ids + tokenizer.encode(c) for c in CONTINUATIONS]
    body = {"model": "smollm2", "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": 1234, "echo": True}
    response = server.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    choices = sorted(response.json()["choices"], key=lambda c: c["index"])
    scores = []
    for ids, choice in zip(prompts, choices):
        expected, argmax = reference_logprobs(reference, ids)
        logprobs = choice["logprobs"]
        assert logprobs["tokens"][:len(ids)] == [tokenizer.decode([i]) for i in ids]
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        assert max(abs(a - b) for a, b in zip(logprobs["token_logprobs"][1:len(ids)], expected)) < TOLERANCE
        assert [max(top, key=top.get) for top in logprobs["top_logprobs"][1:len(ids)]] == \
            [tokenizer.decode([i]) for i in argmax]
        assert len(logprobs["token_logprobs"]) == len(ids) + 1  # the prompt's, then the one generated
        assert choice["text"].startswith(CONTEXT)
        score, is_greedy = lm_eval_scores(choice, len(context_ids))
        assert abs(score - sum(expected[len(context_ids) - 1:])) < TOLERANCE
        assert is_greedy == (argmax[len(context_ids) - 1:] == ids[len(context_ids):])
        scores.append(score)
    assert scores.index(max(scores)) == 0  # " Paris"


def test_max_tokens_0_with_echo_scores_the_prompt_only(server: LaunchedServer, tokenizer: Any) -> None:
    """`max_tokens: 0` with `echo`: the prompt's text and entries, nothing generated."""
    ids = tokenizer.encode(CONTEXT)
    body = {"model": "smollm2", "prompt": CONTEXT, "max_tokens": 0, "echo": True, "logprobs": 0}
    response = server.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    answer = response.json()
    choice = answer["choices"][0]
    assert choice["text"] == CONTEXT and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["token_logprobs"]) == len(ids) and choice["logprobs"]["top_logprobs"] is None
    for token, offset in zip(choice["logprobs"]["tokens"], choice["logprobs"]["text_offset"]):
        assert choice["text"][offset:offset + len(token)] == token
    assert (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]) == (len(ids), 0)


def test_one_token_id_prompt_is_answered_as_its_text(server: LaunchedServer, tokenizer: Any) -> None:
    """A flat list of ids is one prompt; greedy, it continues as the same prompt sent as text."""
    ids = tokenizer.encode("The capital of France is")
    by_ids = server.post("/v1/completions", {"prompt": ids, "max_tokens": 3, "temperature": 0}).json()
    by_text = server.post("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 3,
                                               "temperature": 0}).json()
    assert len(by_ids["choices"]) == 1 and by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("extra, field", [
    ({"prompt": [49152]}, "prompt"),  # SmolLM2's vocabulary is [0, 49152)
    ({"prompt": [[1, 2], [3, 99999999]]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": [[1, 2], "text"]}, "prompt"),
    ({"prompt": [1, [2]]}, "prompt"),
    ({"prompt": [1.5]}, "prompt"),
    ({"prompt": "Hi", "echo": True, "n": 2}, "echo"),
    ({"prompt": "Hi", "echo": True, "best_of": 2}, "best_of"),
    ({"prompt": "Hi", "best_of": 2, "temperature": 0}, "best_of"),
    ({"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1, 2], "echo": True, "stream": True}, "echo"),
])
def test_bad_evaluation_requests_are_refused(server: LaunchedServer, extra: dict[str, Any], field: str) -> None:
    """Each is a 422 naming the field; the server keeps serving."""
    response = server.post("/v1/completions", {"model": "smollm2", "max_tokens": 1, **extra})
    assert response.status_code == 422, response.text
    assert f"`{field}" in response.json()["error"]["message"]
    assert server.get("/health").status_code == 200
