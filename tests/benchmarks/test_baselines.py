"""The baselines ztgi is compared to: static batching, the engine alone, and the comparison's ratios."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ztgi.bench.baseline_model import load_model, load_tokenizer
from ztgi.bench.baseline_run import BaselineRun, joined
from ztgi.bench.compare import CompareConfig, turns
from ztgi.bench.comparison import Comparison
from ztgi.bench.engine_alone import EngineAlone, EngineModel
from ztgi.bench.metrics import RequestRecord, summarize
from ztgi.bench.offline_workload import OfflineRequest, encode_prompts, load_prompts
from ztgi.bench.static_batching import StaticBatching, useful_token_count
from ztgi.common.config import ConfigError

MAX_NEW_TOKENS = [3, 9, 5, 2, 7, 4]


@pytest.fixture(scope="module")
def requests(tiny_model_dir: str) -> list[OfflineRequest]:
    """Six prompts of the mixed set, each asking for its own number of new tokens."""
    prompts = load_prompts("mixed", max_requests=len(MAX_NEW_TOKENS))
    encoded = encode_prompts(load_tokenizer(tiny_model_dir), prompts)
    return [OfflineRequest(r.request_id, r.input_ids, n) for r, n in zip(encoded, MAX_NEW_TOKENS)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: str) -> EngineAlone:
    return EngineAlone(EngineModel(tiny_model_dir, "float32", "cpu"), ignore_eos=True)


def in_flight_at_most(records: list[RequestRecord]) -> int:
    spans = [(r.start_s, r.start_s + r.e2e_s) for r in records]
    return max(sum(1 for start, end in spans if start <= moment < end) for moment, _ in spans)


def test_useful_tokens_stop_at_own_max_and_first_eos() -> None:
    """A request counts up to its own max_new_tokens and its first EOS (included), never the batch's length."""
    assert useful_token_count([5, 6, 2, 7, 2], max_new_tokens=10, eos_token_ids=[2]) == 3
    assert useful_token_count([5, 6, 2, 7, 2], max_new_tokens=2, eos_token_ids=[2]) == 2
    assert useful_token_count([5, 6, 2, 7, 2], max_new_tokens=4, eos_token_ids=[]) == 4
    assert useful_token_count([2, 2, 2], max_new_tokens=3, eos_token_ids=[0, 2]) == 1


def test_static_batching_counts_each_request_its_own_tokens(tiny_model_dir: str,
                                                           requests: list[OfflineRequest]) -> None:
    """In a batch that runs to its longest request, each request contributes only its own max_new_tokens."""
    static = StaticBatching(load_model(tiny_model_dir, "float32", "cpu"), load_tokenizer(tiny_model_dir),
                            batch_size=4, ignore_eos=True)
    static.warmup(requests)
    run = static.run(requests)
    assert [r.num_output_tokens for r in run.records] == MAX_NEW_TOKENS
    assert run.summary.num_output_tokens == sum(MAX_NEW_TOKENS) and run.summary.num_failures == 0
    assert len(run.extra["batch_times_s"]) == 2
    assert run.summary.duration_s >= sum(run.extra["batch_times_s"])
    # the second batch starts when the first (running 9 steps for everyone) has ended
    first_batch, second_batch = run.records[:4], run.records[4:]
    assert min(r.start_s for r in second_batch) >= max(r.start_s + r.e2e_s for r in first_batch)
    assert all(len(r.itl_s) == r.num_output_tokens - 1 and r.ttft_s > 0 for r in run.records)


def test_static_batching_without_ignore_eos_never_counts_past_own_max(tiny_model_dir: str,
                                                                      requests: list[OfflineRequest]) -> None:
    """Without ignore_eos a request's count is its greedy output cut at its own max and first EOS."""
    static = StaticBatching(load_model(tiny_model_dir, "float32", "cpu"), load_tokenizer(tiny_model_dir),
                            batch_size=6)
    run = static.run(requests)
    assert all(1 <= r.num_output_tokens <= n for r, n in zip(run.records, MAX_NEW_TOKENS))
    assert len(run.extra["batch_times_s"]) == 1


def test_engine_alone_completes_every_request_with_exact_max_new_tokens(engine: EngineAlone,
                                                                        requests: list[OfflineRequest]) -> None:
    """Under ignore_eos every request ends with exactly its max_new_tokens, at most `concurrency` in flight."""
    engine.warmup(requests[:3])
    run = engine.run(requests, concurrency=3)
    assert [r.num_output_tokens for r in run.records] == MAX_NEW_TOKENS
    assert all(r.success and r.ttft_s > 0 and len(r.itl_s) == r.num_output_tokens - 1 for r in run.records)
    assert run.summary.num_output_tokens == sum(MAX_NEW_TOKENS)
    assert in_flight_at_most(run.records) == 3
    first_wave_end = max(r.start_s + r.e2e_s for r in run.records[:3])
    # newcomers were prefilled beside the running batch, not after it
    assert any(r.start_s + r.ttft_s < first_wave_end for r in run.records[3:])


def test_engine_alone_at_concurrency_one_runs_requests_one_after_the_other(engine: EngineAlone,
                                                                          requests: list[OfflineRequest]) -> None:
    """At concurrency 1 each request arrives when the previous one ends and is prefilled alone."""
    run = engine.run(requests[:3], concurrency=1)
    assert [r.num_output_tokens for r in run.records] == MAX_NEW_TOKENS[:3]
    assert in_flight_at_most(run.records) == 1
    for earlier, later in zip(run.records, run.records[1:]):  # each prefilled alone, once the one before ended
        assert later.start_s == pytest.approx(earlier.start_s + earlier.e2e_s)
        assert 0 < later.ttft_s <= later.e2e_s


def test_comparison_takes_medians_over_repeats_and_checks_the_claims() -> None:
    """Ratios are of medians over repeats: ztgi/static, ztgi/engine per level, TTFT ztgi/engine at 1."""
    def run(system: str, concurrency: int, tokens: int, duration_s: float, ttft_s: float) -> BaselineRun:
        record = RequestRecord(0, tokens)
        record.set_timings(0.0, [ttft_s + i * 0.01 for i in range(tokens)], duration_s)
        return BaselineRun(system, concurrency, [record], summarize([record], duration_s))

    runs = [run("static", 16, 100, duration, 0.5) for duration in (1.0, 2.0, 10.0)]  # median 50 tok/s
    runs += [run("engine", 16, 100, 0.5, 0.1), run("ztgi", 16, 100, 0.625, 0.1)]  # 200 and 160 tok/s
    runs += [run("engine", 1, 10, 1.0, 0.100), run("ztgi", 1, 10, 1.0, 0.105)]
    comparison = Comparison(runs, static_batch_size=16, concurrencies=[16])
    claims = {claim.name: claim for claim in comparison.claims()}
    assert claims["tok/s ztgi@16 / static@16"].value == pytest.approx(3.2)
    assert claims["tok/s ztgi@16 / engine@16"].value == pytest.approx(0.8)
    assert claims["TTFT p50 ztgi@1 / engine@1"].value == pytest.approx(1.05)
    assert [c.passed for c in claims.values()] == [True, False, True]
    assert "FAIL" in comparison.render_text() and comparison.levels()[0] == ("static", 16)


def test_comparison_claims_paged_over_padded_when_padded_ran() -> None:
    """With a `padded` system (compare --padded) each throughput level gets ztgi/padded >= 1.3; without, no such
    claim."""
    def run(system: str, tokens: int, duration_s: float) -> BaselineRun:
        record = RequestRecord(0, tokens)
        record.set_timings(0.0, [0.1 + i * 0.01 for i in range(tokens)], duration_s)
        return BaselineRun(system, 32, [record], summarize([record], duration_s))

    runs = [run("ztgi", 100, 1.0), run("engine", 100, 1.0)]
    assert not [c for c in Comparison(runs, 16, [32]).claims() if "padded" in c.name]
    runs += [run("padded", 100, duration) for duration in (1.5, 2.0, 1.2)]  # median 66.7 tok/s
    comparison = Comparison(runs, static_batch_size=16, concurrencies=[32])
    claims = {claim.name: claim for claim in comparison.claims()}
    assert claims["tok/s ztgi@32 / padded@32"].value == pytest.approx(1.5)
    assert claims["tok/s ztgi@32 / padded@32"].passed
    assert ("padded", 32) in comparison.levels() and "padded" in comparison.render_text()


def test_static_batching_command_prints_json(tiny_model_dir: str, tmp_path) -> None:
    """`ztgi bench static` prints the summary and writes every request to --output."""
    output = tmp_path / "static.json"
    finished = subprocess.run(
        [sys.executable, "-m", "ztgi.cli", "bench", "static", "--model-id", tiny_model_dir, "--dtype", "float32",
         "--max-requests", "3", "--output-tokens", "4", "--ignore-eos", "--batch-size", "2",
         "--output", str(output)], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    [printed] = json.loads(finished.stdout)["runs"]
    assert printed["summary"]["num_output_tokens"] == 12 and "requests" not in printed
    [written] = json.loads(output.read_text())["runs"]
    assert [r["num_output_tokens"] for r in written["requests"]] == [4, 4, 4]
    assert len(written["batch_times_s"]) == 2


def test_compare_gives_ztgi_and_the_engine_the_same_limits() -> None:
    """Batching limits reach `ztgi launch` as flags and the engine alone as its policy; bad values are refused."""
    config = CompareConfig(max_total_tokens=2048, max_batch_prefill_tokens=2048, waiting_served_ratio=0.5)
    flags = config.launch_flags()
    assert flags[flags.index("--max-total-tokens") + 1] == "2048"
    assert flags[flags.index("--waiting-served-ratio") + 1] == "0.5" and "--max-batch-size" not in flags
    assert (config.policy.max_batch_prefill_tokens, config.policy.waiting_served_ratio) == (2048, 0.5)
    assert config.levels == [1, 16, 32] and config.ignore_eos
    assert "--kv-cache" not in flags and not config.padded
    assert "--no-prefix-caching" in flags  # the baselines have no prefix cache, and the prompts repeat
    padded = CompareConfig(padded=True, memory_budget_mb=256).launch_flags("padded")
    assert padded[padded.index("--kv-cache") + 1] == "padded"
    assert padded[padded.index("--memory-budget-mb") + 1] == "256"
    with pytest.raises(ConfigError, match="--concurrencies"):
        CompareConfig(concurrencies="16,zero")
    with pytest.raises(ConfigError, match="--repeats"):
        CompareConfig(repeats=0)
    with pytest.raises(ConfigError, match="--memory-budget-mb"):
        CompareConfig(memory_budget_mb=0)


def test_concurrency_one_alternates_turns_and_who_goes_first() -> None:
    """Both systems get every request once, in turns, the first of each pair alternating."""
    assert turns(10, 4) == [("engine", slice(0, 4)), ("ztgi", slice(0, 4)), ("ztgi", slice(4, 8)),
                            ("engine", slice(4, 8)), ("engine", slice(8, 10)), ("ztgi", slice(8, 10))]
    assert turns(3, 8) == [("engine", slice(0, 3)), ("ztgi", slice(0, 3))]


def test_joined_turns_read_as_one_run() -> None:
    """Records are renumbered and laid end to end; the durations add up; figures are recomputed."""
    def part(num_requests: int, duration_s: float) -> BaselineRun:
        records = []
        for index in range(num_requests):
            record = RequestRecord(index, 4, start_s=0.5 * index)
            record.set_timings(0.5 * index, [0.5 * index + 0.1 * (t + 1) for t in range(4)], 0.5 * index + 0.4)
            records.append(record)
        return BaselineRun("ztgi", 1, records, summarize(records, duration_s))

    run = joined([part(2, 1.0), part(3, 1.5)])
    assert [r.request_id for r in run.records] == [0, 1, 2, 3, 4]
    assert [r.start_s for r in run.records] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])
    assert run.summary.duration_s == pytest.approx(2.5) and run.summary.num_output_tokens == 20
    assert run.summary.ttft_s.p50 == pytest.approx(0.1)
