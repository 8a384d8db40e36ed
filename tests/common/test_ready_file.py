"""Ready files and `ztgi probe`: what a Kubernetes exec probe on a worker or tokenizer reads.

The last test runs a real scheduler, tokenizer and worker (the tiny model) with ready files and
probes them as the kubelet would, with the `ztgi probe` command in a process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fuzz.processes import HEARTBEAT, LIMITS, REPO_ROOT, ServiceProcess
from ztgi.cli import main as cli_main
from ztgi.common.client.sync_client import ZtgiClient
from ztgi.common.ready_file import ReadyFile, not_ready_reason

START_TIMEOUT_S = 180.0


def test_a_ready_file_is_written_and_removed(tmp_path: Path) -> None:
    """mark_ready writes the file (again: a newer time), clear removes it; no path: nothing happens."""
    path = tmp_path / "ready"
    ready = ReadyFile(str(path))
    ready.mark_ready()
    os.utime(path, (0, 0))
    ready.mark_ready()
    assert path.stat().st_mtime > 0
    ready.clear()
    ready.clear()  # already gone: no error
    assert not path.exists()
    ReadyFile(None).mark_ready()
    ReadyFile(None).clear()


def test_a_ready_file_that_cannot_be_written_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A path in a missing folder: one warning, not one per heartbeat, and no exception."""
    ready = ReadyFile(str(tmp_path / "missing" / "ready"))
    for _ in range(3):
        ready.mark_ready()
    assert sum("cannot write the ready file" in r.getMessage() for r in caplog.records) == 1


def test_not_ready_reasons(tmp_path: Path) -> None:
    """Fresh: ready; missing or older than the limit: a reason that says which and how old."""
    path = tmp_path / "ready"
    assert "does not exist" in (not_ready_reason(str(path), 10.0) or "")
    path.touch()
    written = path.stat().st_mtime
    assert not_ready_reason(str(path), 10.0, now=written + 9.0) is None
    reason = not_ready_reason(str(path), 10.0, now=written + 12.5)
    assert reason is not None and "12.5 s ago" in reason and "--max-age-s 10" in reason


def test_probe_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ztgi probe`: 0 on a fresh file, 1 and the reason on stderr otherwise, 2 on a bad flag."""
    path = tmp_path / "ready"
    assert cli_main(["probe", "--ready-file", str(path)]) == 1
    assert "not ready:" in capsys.readouterr().err
    path.touch()
    assert cli_main(["probe", "--ready-file", str(path), "--max-age-s", "5"]) == 0
    os.utime(path, (time.time() - 60, time.time() - 60))
    assert cli_main(["probe", "--ready-file", str(path), "--max-age-s", "5"]) == 1
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["probe", "--ready-file", str(path), "--max-age-s", "0"])
    assert exit_info.value.code == 2


def test_the_probe_loads_no_model_code(tmp_path: Path) -> None:
    """A probe runs every few seconds in every pod: `ztgi probe` imports neither torch nor transformers."""
    code = ("import sys; from ztgi.cli import main; code = main(['probe', '--ready-file', sys.argv[1]]); "
            "print(code, 'torch' in sys.modules, 'transformers' in sys.modules)")
    completed = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ready")], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=60)
    assert completed.stdout.split() == ["1", "False", "False"], completed.stderr


def probe(path: str, max_age_s: float) -> int:
    """`ztgi probe` in its own process, as the kubelet runs an exec probe."""
    return subprocess.run([sys.executable, "-m", "ztgi.cli", "probe", "--ready-file", path,
                           "--max-age-s", str(max_age_s)], cwd=REPO_ROOT, capture_output=True, timeout=60).returncode


def wait_for(condition: Callable[[], bool], timeout_s: float, processes: list[ServiceProcess]) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        dead = [p for p in processes if not p.alive]
        assert not dead, "\n".join(f"{p.service} exited:\n{p.output()}" for p in dead)
        assert time.monotonic() < deadline, "\n".join(f"--- {p.service}\n{p.output()}" for p in processes)
        time.sleep(0.2)


@pytest.mark.slow
def test_peers_are_ready_while_the_scheduler_counts_them(tiny_model_dir: str, tmp_path: Path) -> None:
    """A worker's and a tokenizer's probes pass once the scheduler counts them (the worker warmed
    up), fail once their scheduler is gone (the files age), and their files go when they stop."""
    scheduler_url = f"ipc://{tmp_path}"
    url = ("--scheduler-url", scheduler_url)
    worker_file, tokenizer_file = str(tmp_path / "worker-ready"), str(tmp_path / "tokenizer-ready")
    scheduler = ServiceProcess("scheduler", *url, *HEARTBEAT, *LIMITS, "--max-batch-prefill-tokens", "256")
    tokenizer = ServiceProcess("tokenizer", *url, *HEARTBEAT, *LIMITS, "--model-id", tiny_model_dir,
                               "--ready-file", tokenizer_file)
    worker = ServiceProcess("worker", *url, *HEARTBEAT, "--model-id", tiny_model_dir, "--device", "cpu",
                            "--dtype", "float32", "--num-threads", "1", "--memory-budget-mb", "16",
                            "--cpu-warmup-prefill-tokens", "64", "--ready-file", worker_file)
    processes = [scheduler, tokenizer, worker]
    client = ZtgiClient(scheduler_url)
    try:
        wait_for(lambda: probe(worker_file, 2.0) == 0 and probe(tokenizer_file, 2.0) == 0, START_TIMEOUT_S, processes)
        stats = client.stats()
        assert stats.num_workers == 1 and stats.num_tokenizers == 1
        assert scheduler.stop() == 0
        time.sleep(2.5)  # past --max-age-s with no heartbeat answered
        assert probe(worker_file, 2.0) == 1 and probe(tokenizer_file, 2.0) == 1
        assert worker.stop() == 0 and tokenizer.stop() == 0
        assert not os.path.exists(worker_file) and not os.path.exists(tokenizer_file)
    finally:
        client.close()
        for process in processes:
            process.stop()
