"""A stop signal that reaches a service while it starts ends it, even where the early hook's
SystemExit is lost inside a `__del__` (common/early_stop.py). Each case runs in a process of its
own: the hooks replace the process's signal handlers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# the signal reaches the early hook inside a finalizer, where Python prints the SystemExit and drops it
SIGNAL_IN_A_FINALIZER = """
import os, signal
from ztgi.common.early_stop import exit_on_stop_signals, stopped_while_starting
exit_on_stop_signals()

class SignalledWhileFreed:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between these bytecodes
            pass

SignalledWhileFreed()
print("still running", stopped_while_starting(), flush=True)
"""


def run_python(source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True,
                          timeout=60)


def test_a_lost_early_exit_stops_the_service_once_its_handler_is_installed() -> None:
    ran = run_python(SIGNAL_IN_A_FINALIZER + """
from ztgi.common.lifecycle import on_stop_signals
stops = []
on_stop_signals(lambda: stops.append("stop"))
print("stops", stops)
""")
    assert ran.returncode == 0, ran.stderr
    assert "Exception ignored" in ran.stderr and "SystemExit" in ran.stderr
    assert ran.stdout.splitlines() == ["still running True", "stops ['stop']"]


def test_a_lost_early_exit_stops_the_gateways_loop() -> None:
    ran = run_python(SIGNAL_IN_A_FINALIZER + """
from aiohttp import web
from ztgi.services.gateway.service import StopOnce, new_event_loop
loop = new_event_loop()
StopOnce().install(loop)
try:
    loop.run_until_complete(__import__("asyncio").sleep(30))
    print("slept")
except web.GracefulExit:
    print("graceful exit")
""")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["still running True", "graceful exit"]


def test_an_early_stop_signal_ends_the_process_with_code_0() -> None:
    ran = run_python("""
import os, signal, time
from ztgi.common.early_stop import exit_on_stop_signals
exit_on_stop_signals()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
print("slept")
""")
    assert (ran.returncode, ran.stdout) == (0, "")
