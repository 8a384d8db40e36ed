"""Stopping a child process: SIGTERM first, SIGKILL only for one that outlives the timeout."""

from __future__ import annotations

import signal
import subprocess
import sys

from ztgi.common.child_process import stop_process, wait_or_kill

IGNORES_SIGTERM = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "print('ready', flush=True); time.sleep(60)")
EXITS_ON_SIGTERM = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(3)); "
                    "print('ready', flush=True); time.sleep(60)")


def start(code: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"  # its handler is in
    return process


def test_sigterm_gives_the_exit_code() -> None:
    """A process that exits on SIGTERM gives its own exit code."""
    process = start(EXITS_ON_SIGTERM)
    assert stop_process(process, 30) == 3


def test_killed_after_timeout() -> None:
    """A process that ignores SIGTERM is killed after the timeout: None, and its returncode says SIGKILL."""
    process = start(IGNORES_SIGTERM)
    assert stop_process(process, 0.5) is None
    assert process.returncode == -signal.SIGKILL


def test_already_exited() -> None:
    """A process that has exited is not signalled: its exit code comes back."""
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"])
    process.wait()
    assert stop_process(process, 1) == 5
    assert wait_or_kill(process, 1) == 5
