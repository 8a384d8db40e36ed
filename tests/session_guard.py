"""A test run that ends when its last test does: no process or thread it started outlives it.

CI waits for `.ci/run` to exit and for its output pipe to close. A service a test started and did not
stop (in a process group of its own, or orphaned when its launcher died) keeps that pipe open; a
non-daemon thread blocked in a test's leftover work keeps the interpreter from exiting. Either way
the run is reported as a timeout long after every test passed, with nothing in the log to say why.

This plugin marks every process the run starts (`ZTGI_TEST_RUN` in the environment, which children
inherit), and when the session ends it names and kills the marked processes still alive and any
process still below this one (a forked child carries no mark: /proc/PID/environ is the environment
it was exec'd with). If the
interpreter then has not exited within `EXIT_GRACE_S` (a thread that never returns), it prints every
thread's stack and exits with the session's status, so the hang is visible and costs a minute.
Under pytest-xdist each worker kills what its own tests left; only the controller watches its exit,
since a worker's process waits, after its last test, until the controller closes its channel.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import uuid

import pytest

RUN_MARKER = "ZTGI_TEST_RUN"
EXIT_GRACE_S = 60.0


def pytest_configure(config: pytest.Config) -> None:
    os.environ[RUN_MARKER] = uuid.uuid4().hex  # a run started from a test marks its own processes


def pytest_unconfigure(config: pytest.Config) -> None:
    leftovers = dict(marked_processes(os.environ[RUN_MARKER]))
    leftovers.update(descendants(os.getpid()))  # forked, not exec'd: /proc/PID/environ is the parent's first one
    for pid, command in sorted(leftovers.items()):
        if "multiprocessing.resource_tracker" in command:
            continue  # multiprocessing's own helper: it ends when this process does
        sys.stderr.write(f"session_guard: a test left process {pid} running ({command}); killing it\n")
        _kill(pid)
    if not hasattr(config, "workerinput"):  # a pytest-xdist worker lives on until the controller ends it
        _exit_even_if_a_thread_hangs(config)


def marked_processes(marker: str) -> list[tuple[int, str]]:
    """Processes other than this one whose environment carries `RUN_MARKER=marker` (Linux /proc)."""
    wanted = f"{RUN_MARKER}={marker}".encode()
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as file:
                if wanted not in file.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if command:  # a zombie has an empty command line and holds nothing open
            found.append((int(name), command[:200]))
    return found


def descendants(root: int) -> list[tuple[int, str]]:
    """The living processes below `root`, from each process's parent in /proc/PID/stat."""
    parents, commands = {}, {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and command:
            parents[int(name)], commands[int(name)] = int(fields[1]), command[:200]
    below: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - below
        below |= frontier
    return [(pid, commands[pid]) for pid in sorted(below)]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _exit_even_if_a_thread_hangs(config: pytest.Config) -> None:
    """A daemon timer: runs only if the interpreter is still waiting on some thread at exit."""
    status = int(getattr(config, "_ztgi_exit_status", 0))

    def report_and_exit() -> None:
        sys.stderr.write(f"session_guard: still not exited {EXIT_GRACE_S:.0f} s after the last test; "
                         "the threads that hold it:\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(status)

    timer = threading.Timer(EXIT_GRACE_S, report_and_exit)
    timer.daemon = True
    timer.start()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._ztgi_exit_status = exitstatus  # type: ignore[attr-defined]
