"""A stop signal that arrives while a service is still starting ends it at once, with code 0.

Python's default SIGTERM action kills a process that is still importing torch or loading a model,
so a launcher that stops a worker it has just restarted saw exit code -15, an unclean stop, for a
process that had nothing to drain yet. Each service's `__main__` installs this first; the
service's `main` then replaces it with its graceful handler once it has something to stop.
"""

from __future__ import annotations

import signal


def _exit_now(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def exit_on_stop_signals() -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_now)
