"""Asking a server's `/health` whether it serves, once or until it does."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request


class NotHealthyError(RuntimeError):
    """The server did not answer `/health` with 200 in time, or its process exited first."""


def is_healthy(url: str, timeout_s: float = 2.0) -> bool:
    """Whether `url`/health answers 200 now; no answer at all counts as not healthy."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):  # HTTPError (503) is a URLError
        return False


def wait_until_healthy(url: str, timeout_s: float, process: subprocess.Popen | None = None,
                       interval_s: float = 0.25) -> float:
    """Polls `url`/health until it answers 200; returns the seconds that took.

    Raises NotHealthyError after `timeout_s`, or as soon as `process` (the server's, when given)
    has exited.
    """
    started = time.monotonic()
    while not is_healthy(url):
        if process is not None and process.poll() is not None:
            raise NotHealthyError(f"{url} exited with code {process.returncode} before it was healthy")
        if time.monotonic() - started > timeout_s:
            raise NotHealthyError(f"{url} not healthy after {timeout_s:g} s")
        time.sleep(interval_s)
    return time.monotonic() - started
