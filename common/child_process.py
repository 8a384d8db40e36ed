"""Stopping a child process: SIGTERM, a while to exit on its own, then SIGKILL."""

from __future__ import annotations

import signal
import subprocess


def wait_or_kill(process: subprocess.Popen, timeout_s: float) -> int | None:
    """Waits for `process` to exit; kills it when it outlives `timeout_s`.

    Returns its exit code, or None when it had to be killed (its `returncode` then says how).
    """
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


def stop_process(process: subprocess.Popen, timeout_s: float) -> int | None:
    """SIGTERM when still running, then `wait_or_kill`: the exit code, or None when killed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return wait_or_kill(process, timeout_s)
