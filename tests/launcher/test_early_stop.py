"""SIGTERM to a service still importing its modules stops it with code 0 (the launcher counts a
child it stops mid-restart as a clean stop, not a crash)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a SIGTERM handler installed (Linux: the SigCgt mask in /proc)."""
    with open(f"/proc/{pid}/status") as status:
        caught = next(line for line in status if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("service", ["worker", "tokenizer"])
def test_sigterm_while_importing_exits_cleanly(service: str) -> None:
    process = subprocess.Popen([sys.executable, "-m", f"ztgi.services.{service}", "--help"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not catches_sigterm(process.pid):
        assert process.poll() is None and time.monotonic() < deadline, "no stop hook before the imports"
        time.sleep(0.005)
    assert process.poll() is None  # the hook is in and torch/transformers are still importing
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()
