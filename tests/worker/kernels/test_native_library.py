"""Building a kernel at first use: processes that start together compile a source once."""

from __future__ import annotations

import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time

import pytest

# imports done, each child says it is ready and waits for the go, then loads: the loads start together
LOAD = """
import logging, os, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
from ztgi.services.worker.kernels import native_library
open(sys.argv[1] + '.ready.' + str(os.getpid()), 'w').close()
while not os.path.exists(sys.argv[1] + '.go'):
    time.sleep(0.01)
native_library.load('llama_decode_stack.c', needs=())
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not (shutil.which("cc") or shutil.which("gcc")),
                    reason="the kernels build on x86 with a C compiler")
def test_processes_starting_together_build_a_source_once(tmp_path: pathlib.Path) -> None:
    """Three processes load the same kernel into an empty cache at the same moment: one compiles
    it, the others wait on its lock and load what it built."""
    env = {**os.environ, "ZTGI_CACHE_DIR": str(tmp_path / "cache")}
    signal = str(tmp_path / "start")
    children = [subprocess.Popen([sys.executable, "-c", LOAD, signal], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for _ in range(3)]
    deadline = time.monotonic() + 120
    while len([name for name in os.listdir(tmp_path) if ".ready." in name]) < 3:
        assert time.monotonic() < deadline and all(child.poll() is None for child in children)
        time.sleep(0.05)
    open(signal + ".go", "w").close()
    outputs = [child.communicate(timeout=300)[0] for child in children]
    assert all(child.returncode == 0 for child in children), outputs
    assert sum("built " in output for output in outputs) == 1, outputs
    assert len(list((tmp_path / "cache" / "kernels").glob("llama_decode_stack-*.so"))) == 1
