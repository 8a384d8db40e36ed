"""The side-by-side against llama.cpp's llama-server: systems, runs in turns, medians and targets, the child."""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
import textwrap

import pytest

from tests.benchmarks.stand_in_server import StandInServer
from ztgi.bench.launched_server import ServerStartError
from ztgi.bench.llama_cpp import LLAMA, LlamaCppConfig, Runner, SystemRun, Table, launch_flags, ztgi_flags
from ztgi.bench.llama_server import LlamaServer, server_flags
from ztgi.bench.load_generator import RunResult
from ztgi.bench.metrics import RequestRecord, summarize
from ztgi.bench.offline_workload import load_prompts
from ztgi.common.config import ConfigError, parse_config


def test_system_names_give_ztgi_flags():
    assert ztgi_flags("ztgi-auto") == ["--dtype", "auto", "--quantize", "auto"]  # the default launch
    assert ztgi_flags("ztgi-float32-none") == ["--dtype", "float32", "--quantize", "none"]
    assert ztgi_flags("ztgi-bfloat16-int8") == ["--dtype", "bfloat16", "--quantize", "int8"]
    for bad in ("ztgi", "ztgi-float64", "ztgi-bfloat16-int2", "vllm-float32", "ztgi-float32-int8-x"):
        with pytest.raises(ConfigError, match="must be ztgi-"):
            ztgi_flags(bad)


def test_config_needs_the_binary_and_a_gguf_model():
    with pytest.raises(ConfigError, match="--llama-server"):
        parse_config(LlamaCppConfig, [])
    with pytest.raises(ConfigError, match="GGUF"):
        parse_config(LlamaCppConfig, ["--llama-server", "/bin/true", "--model-id", "some/hub-id"])
    config = parse_config(LlamaCppConfig, ["--llama-server", "/bin/true", "--systems", "ztgi-float32,ztgi-bfloat16"])
    assert config.all_systems == ["ztgi-float32", "ztgi-bfloat16", LLAMA]


def test_llama_server_flags_are_the_recommended_cpu_ones():
    flags = server_flags("m.gguf", 16, 2, 2048, cache_prompt=False, extra=["--mlock"])
    assert flags == ["-m", "m.gguf", "-np", "16", "-cb", "-t", "2", "-c", "32768", "--no-cache-prompt", "--mlock"]
    assert "--no-cache-prompt" not in server_flags("m.gguf", 16, 2, 2048, cache_prompt=True)


def test_both_prompt_caches_are_off_unless_asked_for():
    """The repeats send the same prompts: a prompt cache on one side would make its later repeats
    nearly free to prefill."""
    config = parse_config(LlamaCppConfig, ["--llama-server", "/bin/true"])
    assert launch_flags(config, "ztgi-auto-int4")[-1] == "--no-prefix-caching"
    assert "--dtype" in launch_flags(config, "ztgi-auto-int4") and "int4" in launch_flags(config, "ztgi-auto-int4")
    cached = parse_config(LlamaCppConfig, ["--llama-server", "/bin/true", "--prompt-cache"])
    assert launch_flags(cached, "ztgi-auto")[-1] == "--prefix-caching"


def test_runs_take_turns_and_the_single_stream_ignores_eos():
    """Every repeat runs each level on every system back to back, the order rotating; concurrency 1
    runs the first prompts with ignore_eos, the other levels respect EOS."""
    config = parse_config(LlamaCppConfig, ["--llama-server", "/bin/true", "--systems", "ztgi-float32",
                                           "--concurrencies", "1,4", "--repeats", "2", "--single-stream-requests", "2"])
    prompts = [p.__class__(p.text, 3, p.input_tokens) for p in load_prompts("mixed", max_requests=6)]
    with StandInServer(ttft_s=0.001, itl_s=0.001) as ztgi, StandInServer(ttft_s=0.001, itl_s=0.001) as llama:
        runner = Runner(config, prompts, {"ztgi-float32": ztgi, LLAMA: llama})
        runs = runner.run_all()
    assert [(r.system, r.concurrency, r.repeat) for r in runs] == [
        ("ztgi-float32", 1, 0), (LLAMA, 1, 0), ("ztgi-float32", 4, 0), (LLAMA, 4, 0),
        (LLAMA, 1, 1), ("ztgi-float32", 1, 1), (LLAMA, 4, 1), ("ztgi-float32", 4, 1)]
    assert all(r.result.summary.num_failures == 0 for r in runs)
    assert [r.result.summary.num_output_tokens for r in runs[:4]] == [6, 6, 18, 18]
    ignore_eos = [body.get("ignore_eos", False) for body in llama.bodies]
    assert ignore_eos == [True] * 2 + [False] * 6 + [True] * 2 + [False] * 6
    assert all(body["stream"] for body in llama.bodies)


def _run(system: str, concurrency: int, repeat: int, ttft_s: float, itl_s: float, num_tokens: int) -> SystemRun:
    records = []
    for index in range(4):
        record = RequestRecord(request_id=index, max_new_tokens=num_tokens)
        times = [ttft_s + i * itl_s for i in range(num_tokens)]
        record.set_timings(0.0, times, times[-1])
        records.append(record)
    result = RunResult(concurrency, None, records, summarize(records, times[-1]))
    return SystemRun(system, concurrency, repeat, result, (0.0, 0.0, 0.0))


def test_table_takes_medians_and_checks_the_issue_targets():
    """Medians over repeats; ratios against llama-server at the same level; 3x tok/s, half the TTFT
    and a lower ITL p99 at each throughput level, TPOT at one stream no higher than llama-server's."""
    runs = [_run("ztgi-bfloat16", 16, r, ttft, 0.01, 10) for r, ttft in enumerate((0.1, 0.2, 0.9))]
    runs += [_run(LLAMA, 16, r, 0.5, 0.05, 10) for r in range(3)]
    runs += [_run("ztgi-bfloat16", 1, 0, 0.02, 0.03, 10), _run(LLAMA, 1, 0, 0.02, 0.02, 10)]
    table = Table(runs, ["ztgi-bfloat16", LLAMA], [1, 16])
    assert table.median("ztgi-bfloat16", 16)["ttft_p50_s"] == pytest.approx(0.2)
    assert table.ratio("ztgi-bfloat16", 16, "ttft_p50_s") == pytest.approx(0.4)
    claims = {c["name"]: c["passed"] for c in table.claims()}
    assert claims == {"ztgi-bfloat16@1 TPOT p50 / llama": False, "ztgi-bfloat16@16 tok/s / llama": True,
                      "ztgi-bfloat16@16 TTFT p50 / llama": True, "ztgi-bfloat16@16 ITL p99 / llama": True,
                      "ztgi-bfloat16@16 resident memory / llama": None}  # no memory sampled in these runs
    with_memory = [dataclasses.replace(run, resident_bytes=(2 if run.system == LLAMA else 3) << 30) for run in runs]
    memory = Table(with_memory, ["ztgi-bfloat16", LLAMA], [1, 16]).ratio("ztgi-bfloat16", 16, "resident_mib")
    assert memory == pytest.approx(1.5)
    text = table.render_text()
    assert "medians over 3 repeat(s)" in text and "FAIL" in text and "PASS" in text
    assert table.to_json()["medians"][0]["system"] == "ztgi-bfloat16"


def _executable(tmp_path, body: str) -> str:
    path = tmp_path / "fake-llama-server"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_llama_server_child_starts_serves_and_stops(tmp_path):
    """The child gets --host/--port before the flags and ztgi's CPU worker's priority, is ready once
    /health answers, stops on SIGTERM."""
    binary = _executable(tmp_path, """
        import http.server, sys
        if "--version" in sys.argv:
            print("version: 1 (fake)"); sys.exit(0)
        port = int(sys.argv[sys.argv.index("--port") + 1])
        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    """)
    with LlamaServer(binary, ["-m", "x.gguf"], startup_timeout_s=30, nice=10, idle_class=True) as server:
        assert server.flags[:2] == ["--host", "127.0.0.1"] and server.flags[-2:] == ["-m", "x.gguf"]
        assert server.version() == "version: 1 (fake)"
        process = server.process
        assert os.getpriority(os.PRIO_PROCESS, process.pid) >= 10  # ztgi's CPU worker's priority
        if hasattr(os, "SCHED_IDLE"):
            assert os.sched_getscheduler(process.pid) == os.SCHED_IDLE
    assert process.poll() is not None and not os.path.exists(server.log_file.name)


def test_llama_server_that_exits_or_is_missing_is_a_start_error(tmp_path):
    binary = _executable(tmp_path, """
        print("error: failed to load model"); raise SystemExit(1)
    """)
    with pytest.raises(ServerStartError, match="failed to load model"):
        LlamaServer(binary, [], startup_timeout_s=30).start()
    with pytest.raises(ServerStartError, match="not an executable"):
        LlamaServer(str(tmp_path / "missing"), [])
