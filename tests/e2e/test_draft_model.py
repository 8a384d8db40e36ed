"""--draft-model-id through the whole pipeline: the draft proposes, the greedy text stays the same;
a bad draft stops the launch with a clear error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.faults import build_small_vocab_model
from tests.e2e.server import LaunchedServer
from tests.e2e.test_metrics_tokenize import scrape
from tests.e2e.test_pipeline import FLOAT32, generate, stream
from tests.e2e.test_speculation import NUM_NEW_TOKENS, greedy_reference
from ztgi.common.free_ports import free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_draft_dir: str):
    """SmolLM2 (float32) with --speculate 4 and a tiny random draft of SmolLM2's vocabulary."""
    launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), *FLOAT32, "--speculate", "4",
                              "--draft-model-id", tiny_draft_dir)
    yield launched
    assert launched.stop() == 0, launched.log


def test_greedy_with_a_draft_equals_transformers(server: LaunchedServer, smollm2, tiny_draft_dir: str) -> None:
    """Copy and edit prompts: ids and logprobs equal transformers' greedy generate (what speculation
    off gives, tests/e2e/test_greedy_parity.py), streamed one event per token, while the draft's
    proposals are verified (the metrics count them); /info shows `speculate` and the draft."""
    info = server.get("/info").json()
    assert (info["speculate"], info["draft_model_id"]) == (4, tiny_draft_dir)
    before = scrape(server)
    for prompt, ids, logprobs, text in greedy_reference(smollm2.path).values():
        body = generate(server, prompt, max_new_tokens=NUM_NEW_TOKENS)
        tokens = body["details"]["tokens"]
        assert [t["id"] for t in tokens] == ids
        assert [t["logprob"] for t in tokens] == pytest.approx(logprobs, abs=1e-3)
        assert body["generated_text"] == text
    events = stream(server, prompt, max_new_tokens=NUM_NEW_TOKENS)
    assert [e["token"]["id"] for e in events] == ids and events[-1]["generated_text"] == text
    proposed = ("ztgi_speculative_proposed_tokens_total", frozenset())
    assert scrape(server)[proposed] > before.get(proposed, 0.0)


def launch_fails(run_dir: str, *flags: str) -> tuple[int, str]:
    """`ztgi launch` with `flags`, expected to stop by itself: its exit code and output."""
    process = subprocess.run(
        [sys.executable, "-m", "ztgi.services.launcher", "--port", str(free_port()), "--run-dir", run_dir,
         "--startup-timeout-s", "120", *flags], capture_output=True, text=True, timeout=180)
    return process.returncode, process.stdout + process.stderr


def test_a_bad_draft_stops_the_launch(tmp_path, smollm2, tiny_draft_dir: str) -> None:
    """A missing draft, a draft of another vocabulary, a draft without --speculate: the launch exits
    non-zero with an error naming the problem, and no traceback."""
    small = build_small_vocab_model(str(tmp_path / "small"), smollm2.path)
    cases = [(("--speculate", "4", "--draft-model-id", str(tmp_path / "missing")),
              "--draft-model-id '" + str(tmp_path / "missing")),
             (("--speculate", "4", "--draft-model-id", small), "a draft must share the target's tokenizer"),
             (("--draft-model-id", tiny_draft_dir), "--draft-model-id needs --speculate N > 0")]
    for index, (flags, message) in enumerate(cases):
        run_dir = tmp_path / f"run{index}"
        run_dir.mkdir()
        code, output = launch_fails(str(run_dir), *FLOAT32, *flags)
        assert code != 0 and message in output, output
        assert "Traceback" not in output, output
