"""`ztgi.bench.offline` (`ztgi bench --offline`): LLM.generate's throughput beside the baselines."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

from ztgi.bench.offline import OfflineConfig, render_text, run_all
from ztgi.bench.offline_workload import load_prompts


def test_every_system_generates_the_same_tokens(tiny_model_dir: str) -> None:
    """Two repeats on the tiny model: static, engine and offline runs each, every one producing each
    request's max_new_tokens; the table shows both ratios."""
    config = OfflineConfig(model_id=tiny_model_dir, device="cpu", max_requests=5, output_tokens=3, repeats=2,
                           static_batch_size=2)
    try:
        runs = run_all(config, load_prompts(config.dataset, config.output_tokens, config.max_requests))
    finally:
        gc.unfreeze()  # LLM froze the objects alive at its start
    assert sorted((run.system, run.extra["repeat"]) for run in runs) == sorted(
        (system, repeat) for system in ("static", "engine", "offline") for repeat in (0, 1))
    assert all(run.summary.num_output_tokens == 15 and run.summary.num_failures == 0 for run in runs)
    assert all(run.extra["cpu_s"] > 0 for run in runs)
    assert [run.concurrency for run in runs if run.system == "engine"] == [5, 5]
    table = render_text(runs)
    assert "offline / engine:" in table and "offline / static:" in table and "CPU per output token" in table


def test_cli_offline_flag(tiny_model_dir: str, tmp_path) -> None:
    """`ztgi bench --offline` runs the offline benchmark (here LLM.generate alone) and writes JSON."""
    output = tmp_path / "offline.json"
    completed = subprocess.run(
        [sys.executable, "-m", "ztgi.cli", "bench", "--offline", "--model-id", tiny_model_dir, "--device", "cpu",
         "--max-requests", "3", "--output-tokens", "2", "--no-baselines", "--output", str(output)],
        capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr
    assert "| offline | 3 |" in completed.stdout
    result = json.loads(output.read_text())
    assert [run["system"] for run in result["runs"]] == ["offline"]
    assert result["runs"][0]["summary"]["num_output_tokens"] == 6
