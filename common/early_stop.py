"""A stop signal that arrives while a service is still starting ends it at once, with code 0;
one that arrives once it has stopped changes nothing.

Python's default SIGTERM action kills a process that is still importing torch or loading a model,
so a launcher that stops a worker it has just restarted saw exit code -15, an unclean stop, for a
process that had nothing to drain yet. Each service's `__main__` installs this first; the
service's `main` then replaces it with its graceful handler once it has something to stop.

The same default comes back while the interpreter shuts down (Python restores it for every
signal it handled), so a second signal, the launcher's SIGTERM after the one a whole process
group got, killed a service that had already drained. `exit_after` ignores the stop signals
from the moment `main` returns.

SIGHUP (a closed terminal, a service manager's reload) stops like SIGTERM and SIGINT.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _exit_now(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def exit_on_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, _exit_now)


def ignore_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def exit_after(main: Callable[[], int]) -> None:
    """`sys.exit(main())`, deaf to stop signals once `main` has returned."""
    try:
        code = main()
    finally:
        ignore_stop_signals()
    sys.exit(code)
