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

The SystemExit the early hook raises can be lost: Python runs a signal handler between any two
bytecodes, and an exception raised inside a `__del__` method or a weakref callback is printed and
dropped ("Exception ignored in"). So the hook also records the signal, and `stopped_while_starting`
tells the graceful handler's installer (`common/lifecycle.py`, the gateway's `StopOnce`) to stop
at once: a worker restarted and then stopped while importing must not go on to load and serve.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


_early_stops: list[int] = []


def _exit_now(signum: int, _frame: object) -> None:
    _early_stops.append(signum)
    raise SystemExit(0)


def stopped_while_starting() -> bool:
    """Whether a stop signal reached the early hook (and the process still runs: its exit was lost)."""
    return bool(_early_stops)


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
