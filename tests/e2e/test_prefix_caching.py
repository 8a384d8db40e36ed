"""Prefix caching end to end with SmolLM2: prompts sharing a document answer exactly as with
`--no-prefix-caching` (up to float near-ties), and report the prompt tokens they took from the cache."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest

from tests.e2e.server import LaunchedServer
from ztgi.bench.greedy_parity import GreedyStream, assert_same_greedy

DOCUMENT = " ".join(f"Fact {i}: the {w} is kept in room {i * 7 % 31}." for i, w in
                    enumerate(["red box", "old map", "blue key", "tin cup", "green book", "iron bell",
                               "silk rope", "glass jar", "brass lamp", "paper kite"] * 2))
QUESTIONS = ["Where is the blue key?", "Where is the tin cup?", "What is in room 0?", "Where is the old map?"]
MAX_NEW = 12


def _answers(server: LaunchedServer) -> list[dict]:
    """The first question alone (it fills the cache), then the rest at once."""
    def ask(question: str) -> dict:
        body = {"inputs": f"{DOCUMENT}\nQuestion: {question}\nAnswer:",
                "parameters": {"max_new_tokens": MAX_NEW, "details": True, "top_n_tokens": 2}}
        response = server.post("/generate", body)
        assert response.status_code == 200, response.text
        return response.json()

    first = ask(QUESTIONS[0])
    with concurrent.futures.ThreadPoolExecutor(len(QUESTIONS) - 1) as pool:
        return [first, *pool.map(ask, QUESTIONS[1:])]


@pytest.mark.slow
def test_shared_prefix_answers_equal_uncached_ones_and_report_cached_tokens(tmp_path) -> None:
    """Greedy texts with the cache on equal those with it off (up to a float near-tie); the later questions took most of
    the document from the cache (details and OpenAI usage say how much); off, nothing is cached."""
    # float32: a prefill over cached blocks has other shapes than a whole one, and bfloat16's
    # rounding follows the shapes; the claim here is that caching changes nothing else
    cached_server = LaunchedServer(str(tmp_path / "on"), "--dtype", "float32", startup_timeout_s=600)
    try:
        cached = _answers(cached_server)
        with openai.OpenAI(base_url=cached_server.url + "/v1", api_key="-", max_retries=0, timeout=120) as client:
            chat = [{"role": "user", "content": f"{DOCUMENT}\nWhere is the red box?"}]
            usages = [client.chat.completions.create(model="any", messages=chat, temperature=0, max_tokens=2).usage
                      for _ in range(2)]
    finally:
        assert cached_server.stop() == 0, cached_server.log
    uncached_server = LaunchedServer(str(tmp_path / "off"), "--no-prefix-caching", "--dtype", "float32",
                                     startup_timeout_s=600)
    try:
        uncached = _answers(uncached_server)
    finally:
        assert uncached_server.stop() == 0, uncached_server.log
    for with_cache, without in zip(cached, uncached):
        assert_same_greedy(*(GreedyStream.from_details(answer["details"]) for answer in (without, with_cache)))
    assert cached[0]["details"]["cached_tokens"] == 0
    assert all(a["details"]["cached_tokens"] >= 200 for a in cached[1:]), [a["details"] for a in cached]
    assert all(a["details"]["cached_tokens"] == 0 for a in uncached)
    assert usages[1].prompt_tokens_details.cached_tokens >= usages[1].prompt_tokens - 16
