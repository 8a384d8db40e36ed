"""`ztgi bench` as a user runs it, against a stand-in server streaming at a known cadence."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.benchmarks.stand_in_server import StandInServer

TTFT_S = 0.05
ITL_S = 0.02


@pytest.fixture(scope="module")
def server() -> Iterator[StandInServer]:
    with StandInServer(ttft_s=TTFT_S, itl_s=ITL_S) as stand_in:
        yield stand_in


def run_bench(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ztgi.cli", "bench", *flags],
                          capture_output=True, text=True, timeout=60)


def bench_results(tmp_path, *flags: str) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    output = tmp_path / "results.json"
    finished = run_bench(*flags, "--output", str(output))
    assert finished.returncode == 0, finished.stderr
    return finished, json.loads(output.read_text())


def max_in_flight(requests: list[dict[str, Any]]) -> int:
    spans = [(r["start_s"], r["start_s"] + r["e2e_s"]) for r in requests]
    return max(sum(1 for start, end in spans if start <= moment < end) for moment, _ in spans)


@pytest.mark.parametrize("backend", ["tgi", "openai-completions", "openai-chat"])
def test_closed_loop_counts_and_cadence(server: StandInServer, tmp_path, backend: str) -> None:
    """8 requests, 4 in flight, 5 tokens each: counts exact, TTFT/ITL/TPOT match the cadence."""
    server.bodies.clear()
    finished, results = bench_results(
        tmp_path, "--url", server.url, "--backend", backend, "--concurrency", "4", "--num-requests", "8",
        "--input-tokens", "16", "--output-tokens", "5", "--ignore-eos")
    [run] = results["runs"]
    summary, requests = run["summary"], run["requests"]
    assert (summary["num_requests"], summary["num_failures"], summary["num_output_tokens"]) == (8, 0, 40)
    assert all(r["success"] and r["num_output_tokens"] == 5 and len(r["itl_s"]) == 4 for r in requests)
    assert max_in_flight(requests) == 4
    assert TTFT_S * 0.9 <= summary["ttft_s"]["p50"] <= TTFT_S + 0.05
    assert ITL_S * 0.75 <= summary["itl_s"]["p50"] <= ITL_S + 0.02
    assert ITL_S * 0.9 <= summary["tpot_s"]["mean"] <= ITL_S + 0.02
    assert summary["e2e_s"]["p50"] >= TTFT_S + 4 * ITL_S * 0.9
    assert len(server.bodies) == 8 and all(body.get("ignore_eos") or body["parameters"]["ignore_eos"]
                                           for body in server.bodies)
    assert "TTFT" in finished.stdout and "output throughput" in finished.stdout


def test_failures_are_counted_with_their_error(server: StandInServer, tmp_path) -> None:
    """An error event and an HTTP 422 are failures with their text; the others still count."""
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p, "max_new_tokens": 3}) + "\n"
                               for p in ("fine", "please FAIL", "REJECT me", "fine again")))
    finished, results = bench_results(tmp_path, "--url", server.url, "--dataset", str(dataset),
                                      "--concurrency", "2")
    [run] = results["runs"]
    assert (run["summary"]["num_requests"], run["summary"]["num_failures"]) == (4, 2)
    errors = [r["error"] for r in run["requests"]]
    assert errors[0] is None and errors[3] is None
    assert errors[1] == "generation: worker lost"
    assert errors[2].startswith("HTTP 422: ") and "rejected" in errors[2]
    assert run["summary"]["num_output_tokens"] == 6
    assert "failed 1x: generation: worker lost" in finished.stdout


def test_sweep_runs_each_level_and_plots(server: StandInServer, tmp_path) -> None:
    """--sweep 1,2 runs two levels (at most that many in flight) and writes a PNG."""
    plot = tmp_path / "sweep.png"
    finished, results = bench_results(tmp_path, "--url", server.url, "--sweep", "1,2", "--num-requests", "4",
                                      "--output-tokens", "3", "--plot", str(plot))
    assert [run["concurrency"] for run in results["runs"]] == [1, 2]
    assert [max_in_flight(run["requests"]) for run in results["runs"]] == [1, 2]
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert "sweep (latencies in ms)" in finished.stdout


def test_poisson_arrivals_stop_at_the_duration(server: StandInServer, tmp_path) -> None:
    """--request-rate 40 for 0.5 s sends the seeded arrivals that fall before 0.5 s, on time."""
    rng, arrivals = random.Random(0), [0.0]
    while arrivals[-1] + (gap := rng.expovariate(40.0)) < 0.5:
        arrivals.append(arrivals[-1] + gap)
    _, results = bench_results(tmp_path, "--url", server.url, "--request-rate", "40", "--duration-s", "0.5",
                               "--output-tokens", "2", "--seed", "0")
    [run] = results["runs"]
    assert run["concurrency"] is None and run["request_rate"] == 40.0
    assert len(run["requests"]) == len(arrivals)
    assert all(abs(r["start_s"] - at) < 0.05 for r, at in zip(run["requests"], arrivals))


def test_request_count_bounds_a_long_duration(server: StandInServer, tmp_path) -> None:
    """--num-requests 3 with --duration-s 30 stops after 3 requests (whichever comes first)."""
    _, results = bench_results(tmp_path, "--url", server.url, "--num-requests", "3", "--duration-s", "30",
                               "--output-tokens", "2")
    assert len(results["runs"][0]["requests"]) == 3
    assert results["runs"][0]["summary"]["duration_s"] < 5


def test_unreachable_server_fails_every_request(tmp_path) -> None:
    """Nothing listening: each request fails with the connection error, exit status 1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    output = tmp_path / "results.json"
    finished = run_bench("--url", url, "--num-requests", "2", "--output", str(output))
    assert finished.returncode == 1
    [run] = json.loads(output.read_text())["runs"]
    assert run["summary"]["num_failures"] == 2
    assert all(r["error"].startswith("ClientConnectorError") for r in run["requests"])


def test_bad_dataset_exits_2_naming_the_line(tmp_path) -> None:
    """A malformed dataset line stops the bench before any request, with file and line."""
    dataset = tmp_path / "bad.jsonl"
    dataset.write_text('{"prompt": "x"}\n')
    finished = run_bench("--dataset", str(dataset))
    assert finished.returncode == 2
    assert "bad.jsonl:1: `max_new_tokens` must be an integer" in finished.stderr


def test_serve_subcommand_is_the_default(server: StandInServer, tmp_path) -> None:
    """`ztgi bench serve FLAGS` runs what `ztgi bench FLAGS` runs."""
    _, results = bench_results(tmp_path, "serve", "--url", server.url, "--num-requests", "2",
                               "--input-tokens", "8", "--output-tokens", "3", "--ignore-eos")
    [run] = results["runs"]
    assert (run["summary"]["num_requests"], run["summary"]["num_output_tokens"]) == (2, 6)


def test_latency_runs_one_request_at_a_time_after_its_warmup(server: StandInServer, tmp_path) -> None:
    """`ztgi bench latency`: the warmup requests reach the server but not the figures; one in flight."""
    server.bodies.clear()
    _, results = bench_results(tmp_path, "latency", "--url", server.url, "--num-requests", "3",
                               "--warmup-requests", "2", "--input-tokens", "8", "--output-tokens", "4",
                               "--ignore-eos")
    [run] = results["runs"]
    assert run["concurrency"] == 1 and run["summary"]["num_requests"] == 3
    assert max_in_flight(run["requests"]) == 1 and len(server.bodies) == 5
    assert TTFT_S * 0.9 <= run["summary"]["ttft_s"]["p50"] <= TTFT_S + 0.05
    assert ITL_S * 0.9 <= run["summary"]["tpot_s"]["mean"] <= ITL_S + 0.02


def test_latency_refuses_more_than_one_in_flight() -> None:
    finished = run_bench("latency", "--concurrency", "4")
    assert finished.returncode == 2 and "one request at a time" in finished.stderr


@pytest.mark.parametrize("subcommand", ["serve", "latency", "throughput", "compare", "llama-cpp", "static", "engine"])
def test_every_subcommand_has_help(subcommand: str, capsys: pytest.CaptureFixture[str]) -> None:
    """In this process, through the command's own dispatch: the subcommands that import torch and
    transformers import them once for all (a process each cost seconds each)."""
    from ztgi.bench.commands import main as bench_main

    with pytest.raises(SystemExit) as exited:
        bench_main([subcommand, "--help"])
    assert exited.value.code == 0
    assert f"usage: ztgi bench {subcommand}" in capsys.readouterr().out


def test_bench_help_lists_the_subcommands() -> None:
    finished = run_bench("--help")
    assert finished.returncode == 0
    assert all(name in finished.stdout for name in ("serve", "latency", "throughput", "compare", "llama-cpp"))
