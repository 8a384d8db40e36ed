"""LoRA adapters through every process (`ztgi launch --lora-adapters`, float32, the tiny random
Llama): 16 concurrent requests of three adapters and the base model give PEFT's merged models'
greedy tokens, by TGI's `adapter_id` and by OpenAI's `model`; adapters loaded and unloaded at run
time; the prefix cache keyed by adapter; every bad adapter a clear 4xx with nothing else harmed."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import threading

import pytest
import requests
from transformers import AutoTokenizer

from tests.e2e.server import LaunchedServer
from tests.lora_adapters import RECIPES, AdapterRecipe, merged_greedy, save_adapter
from ztgi.common.free_ports import free_port

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time", "List three colours:"]
MAX_NEW = 8
LONG_PROMPT = " ".join(f"Room {i} holds a {thing}." for i, thing in enumerate(["red box", "old map", "tin cup"] * 4))


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tiny_draft_dir, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("e2e-adapters")
    made = {name: save_adapter(tiny_model_dir, str(root / name), recipe) for name, recipe in RECIPES.items()}
    made["bard"] = save_adapter(tiny_model_dir, str(root / "bard"), AdapterRecipe(2, ("o_proj", "up_proj"), seed=14))
    made["too-wide"] = save_adapter(tiny_model_dir, str(root / "too-wide"), AdapterRecipe(32, ("q_proj",), seed=15))
    made["other-base"] = save_adapter(tiny_draft_dir, str(root / "other-base"), AdapterRecipe(4, ("q_proj",)))
    return made


@pytest.fixture(scope="module")
def server(tiny_model_dir, adapters, tmp_path_factory):
    launched = LaunchedServer(
        str(tmp_path_factory.mktemp("lora-run")), "--model-id", tiny_model_dir, "--kv-cache", "paged", "--dtype",
        "float32", "--lora-adapters", f"poet={adapters['poet']},coder={adapters['coder']}", "--max-lora-rank", "16",
        "--max-input-tokens", "400", "--max-total-tokens", "512")
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def prompt_ids(tiny_model_dir) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return [tokenizer(p)["input_ids"] for p in PROMPTS]


def _generate(server: LaunchedServer, prompt: str, adapter: str | None, max_new: int = MAX_NEW) -> dict:
    parameters: dict = {"max_new_tokens": max_new, "details": True, "ignore_eos": True}
    if adapter is not None:
        parameters["adapter_id"] = adapter
    response = server.post("/generate", {"inputs": prompt, "parameters": parameters})
    assert response.status_code == 200, response.text
    return response.json()


def _mixed_round(server: LaunchedServer, names: list[str | None]) -> dict[tuple[str | None, int], list[int]]:
    """Every prompt under every name, all at once (len(names) x 4 concurrent requests)."""
    jobs = [(name, index) for name in names for index in range(len(PROMPTS))]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        answers = pool.map(lambda job: _generate(server, PROMPTS[job[1]], job[0]), jobs)
        return {job: [t["id"] for t in answer["details"]["tokens"]] for job, answer in zip(jobs, answers, strict=True)}


def _expected(base_dir: str, adapters: dict[str, str], names: list[str | None],
              prompt_ids: list[list[int]]) -> dict[tuple[str | None, int], list[int]]:
    return {(name, index): tokens for name in names
            for index, tokens in enumerate(merged_greedy(base_dir, adapters.get(name), prompt_ids, MAX_NEW))}


def test_mixed_adapters_equal_merged_models_then_swapped(server, tiny_model_dir, adapters, prompt_ids):
    """poet and coder from --lora-adapters, sage loaded at run time: 16 concurrent requests; then
    poet unloaded and bard loaded: 16 again. Listed in /v1/models and /info throughout."""
    loaded = server.post("/v1/load_lora_adapter", {"lora_name": "sage", "lora_path": adapters["sage"]})
    assert loaded.status_code == 200, loaded.text
    assert server.get("/info").json()["lora_adapters"] == ["poet", "coder", "sage"]
    names: list[str | None] = [None, "poet", "coder", "sage"]
    expected = _expected(tiny_model_dir, adapters, names, prompt_ids)
    assert len({tuple(v) for v in expected.values()}) > len(PROMPTS), "the adapters change the answers"
    assert _mixed_round(server, names) == expected

    assert server.post("/v1/unload_lora_adapter", {"lora_name": "poet"}).status_code == 200
    assert server.post("/v1/load_lora_adapter", {"lora_name": "bard", "lora_path": adapters["bard"]}).status_code == 200
    models = [card["id"] for card in server.get("/v1/models").json()["data"]]
    assert models[1:] == ["coder", "sage", "bard"]
    names = [None, "coder", "sage", "bard"]
    expected = _expected(tiny_model_dir, adapters, names, prompt_ids)
    assert _mixed_round(server, names) == expected
    gone = server.post("/generate", {"inputs": "hi", "parameters": {"adapter_id": "poet"}})
    assert gone.status_code == 422 and "poet" in gone.json()["error"], gone.text


def test_openai_model_selects_the_adapter(server):
    """`model` naming an adapter answers as `adapter_id` does; any other model name is the base."""
    for adapter in ("coder", None):
        tgi = _generate(server, PROMPTS[0], adapter)["generated_text"]
        body = {"model": adapter or "anything", "prompt": PROMPTS[0], "max_tokens": MAX_NEW, "temperature": 0,
                "ignore_eos": True}
        response = server.post("/v1/completions", body)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == tgi


def test_structured_output_under_an_adapter(server):
    """A grammar constrains an adapter's tokens as it does the base model's."""
    grammar = {"type": "regex", "value": "(red|green|blue), (red|green)"}
    body = {"inputs": PROMPTS[3], "parameters": {"adapter_id": "coder", "max_new_tokens": 12, "grammar": grammar}}
    response = server.post("/generate", body)
    assert response.status_code == 200, response.text
    allowed = {f"{a}, {b}" for a in ("red", "green", "blue") for b in ("red", "green")}
    assert response.json()["generated_text"] in allowed


def test_prefix_cache_is_keyed_by_adapter(server, tiny_model_dir, adapters):
    """One long prompt under coder then sage: each its merged model's answer (sage never reads
    coder's blocks); again under sage: most of it from the cache, the same answer."""
    loaded = server.post("/v1/load_lora_adapter", {"lora_name": "sage", "lora_path": adapters["sage"]})
    assert loaded.status_code in (200, 409), loaded.text  # 409: an earlier test loaded it
    ids = AutoTokenizer.from_pretrained(tiny_model_dir)(LONG_PROMPT)["input_ids"]
    assert len(ids) > 64
    for name in ("coder", "sage", "sage"):
        answer = _generate(server, LONG_PROMPT, name)
        expected = merged_greedy(tiny_model_dir, adapters[name], [ids], MAX_NEW)[0]
        assert [t["id"] for t in answer["details"]["tokens"]] == expected, name
    assert answer["details"]["cached_tokens"] >= len(ids) - 16, answer["details"]


def test_bad_adapters_are_clear_4xx_and_harm_nothing(server, adapters, tmp_path):
    """Each refusal names the problem; a stream under an adapter goes on while its unload is
    refused (409), and the server serves after all of them."""
    def load(name: str, path: str) -> requests.Response:
        return server.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    refusals = [
        (load("missing", str(tmp_path / "nope")), 400, "not a directory"),
        (load("broken", str(broken)), 400, "not a JSON file"),
        (load("wide", adapters["too-wide"]), 400, "above --max-lora-rank 16"),
        (load("other", adapters["other-base"]), 400, "another base model"),
        (load("coder", adapters["sage"]), 409, "already loaded"),
        (server.post("/v1/unload_lora_adapter", {"lora_name": "nobody"}), 404, "nobody"),
        (server.post("/generate", {"inputs": "hi", "parameters": {"adapter_id": "nobody"}}), 422, "nobody"),
    ]
    for response, status, words in refusals:
        assert response.status_code == status and words in response.text, (status, response.text)

    body = {"inputs": "Tell me a story", "parameters": {"max_new_tokens": 400, "ignore_eos": True,
                                                        "adapter_id": "coder"}}
    events: list[dict] = []
    streaming = threading.Thread(target=_stream, args=(server, body, events))
    streaming.start()
    try:
        while not events:
            threading.Event().wait(0.05)
        in_use = server.post("/v1/unload_lora_adapter", {"lora_name": "coder"})
        assert in_use.status_code == 409 and "in use" in in_use.text, in_use.text
    finally:
        streaming.join(120)
    assert events[-1]["details"]["generated_tokens"] == 400
    assert _generate(server, PROMPTS[1], "coder")["details"]["generated_tokens"] == MAX_NEW


def _stream(server: LaunchedServer, body: dict, events: list[dict]) -> None:
    """The stream's events appended to `events` as they come."""
    with requests.post(server.url + "/generate_stream", json=body, stream=True, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith(b"data:"):
                events.append(json.loads(line[5:]))


def test_bad_start_adapter_refuses_the_start(tiny_model_dir, tmp_path):
    """--lora-adapters naming a directory that is not an adapter: the launch fails, saying why."""
    result = subprocess.run(
        [sys.executable, "-m", "ztgi.services.launcher", "--model-id", tiny_model_dir, "--run-dir", str(tmp_path),
         "--port", str(free_port()), "--lora-adapters", f"nothing={tmp_path / 'nothing'}", "--startup-timeout-s", "60"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "nothing" in result.stdout + result.stderr and "not a directory" in result.stdout + result.stderr
