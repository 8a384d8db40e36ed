"""--speculate through the whole pipeline: the same greedy text, several tokens a step, one event each."""

from __future__ import annotations

import pytest
import torch

from tests.e2e.server import LaunchedServer
from tests.e2e.test_metrics_tokenize import scrape
from tests.e2e.test_pipeline import FLOAT32, generate, stream

CODE = ("def add(a, b):\n    return a + b\n\ndef multiply(a, b):\n    return a * b\n\n"
        "def subtract(a, b):\n    return a - b\n")
ASKS = ["Rename the functions with the prefix `op_` and repeat the code:\n" + CODE,
        "Repeat this code exactly:\n" + CODE]
NUM_NEW_TOKENS = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """One launched pipeline (float32, so batch makeup cannot move a token) with --speculate 4."""
    launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), *FLOAT32, "--speculate", "4")
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def reference(smollm2) -> dict[str, tuple[str, list[int], list[float], str]]:
    return greedy_reference(smollm2.path)


def greedy_reference(model_path: str) -> dict[str, tuple[str, list[int], list[float], str]]:
    """transformers' greedy `generate` on each chat prompt: the prompt text, the ids, their logprobs
    and the text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    out = {}
    for ask in ASKS:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": ask}], add_generation_prompt=True,
                                               tokenize=False)
        inputs = tokenizer(prompt, return_tensors="pt")
        with torch.inference_mode():
            result = model.generate(**inputs, max_new_tokens=NUM_NEW_TOKENS, do_sample=False,
                                    output_logits=True, return_dict_in_generate=True)
        ids = result.sequences[0, inputs["input_ids"].shape[1]:].tolist()
        logprobs = [torch.log_softmax(step[0].float(), -1)[token].item() for step, token in zip(result.logits, ids)]
        out[ask] = (prompt, ids, logprobs, tokenizer.decode(ids, skip_special_tokens=True))
    return out


def test_info_shows_speculate(server: LaunchedServer) -> None:
    """/info reports the number of proposed tokens per step (TGI's `speculate`)."""
    assert server.get("/info").json()["speculate"] == 4


def test_greedy_equals_transformers_with_proposals_accepted(server: LaunchedServer, reference) -> None:
    """Copy and edit prompts: ids and logprobs equal transformers' greedy generate, the stream has one
    event per token, and the metrics show accepted proposals (several tokens in a step)."""
    before = scrape(server)
    for prompt, ids, logprobs, text in reference.values():
        body = generate(server, prompt, max_new_tokens=NUM_NEW_TOKENS, top_n_tokens=2)
        tokens = body["details"]["tokens"]
        assert [t["id"] for t in tokens] == ids
        assert [t["logprob"] for t in tokens] == pytest.approx(logprobs, abs=1e-3)
        assert all(top[0]["id"] == t["id"] for top, t in zip(body["details"]["top_tokens"], tokens))
        assert body["generated_text"] == text
    prompt, ids, _, text = reference[ASKS[0]]
    events = stream(server, prompt, max_new_tokens=NUM_NEW_TOKENS)
    assert [e["token"]["id"] for e in events] == ids and events[-1]["generated_text"] == text
    after = scrape(server)
    accepted = after[("ztgi_speculative_accepted_tokens_total", frozenset())] - before.get(
        ("ztgi_speculative_accepted_tokens_total", frozenset()), 0.0)
    assert accepted > 0


def test_stop_sequence_inside_an_accepted_run(server: LaunchedServer, reference) -> None:
    """A stop sequence met inside a run of accepted tokens ends the text there: nothing after it is
    streamed or counted."""
    prompt, _, _, full = reference[ASKS[1]]
    stop = full.split("\n")[1].strip()  # the second line, a run of the copy
    assert len(stop) > 5
    events = stream(server, prompt, max_new_tokens=NUM_NEW_TOKENS, stop=[stop], details=True)
    final = events[-1]
    assert final["details"]["finish_reason"] == "stop_sequence"
    assert final["generated_text"] == full[:full.index(stop) + len(stop)]
    assert "".join(e["token"]["text"] for e in events) == final["generated_text"]
    assert final["details"]["generated_tokens"] == len(events)
