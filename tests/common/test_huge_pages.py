"""A worker's large torch buffers on transparent huge pages (`huge_pages.py`): asked for before torch
loads, a user's own setting kept, and nothing promised once torch is already loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ztgi.common.huge_pages import VARIABLE

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# a child: optionally asks, then loads torch and reports how much of a 64 MiB tensor's mapping is on huge pages
CHILD = """
import sys
from ztgi.common.huge_pages import ask_for_huge_pages
taken = ask_for_huge_pages() if sys.argv[1] == "ask" else None
import torch
tensor = torch.ones(64 << 20, dtype=torch.uint8)
address, huge_kb = tensor.data_ptr(), 0
mapping = None
for line in open("/proc/self/smaps"):
    fields = line.split()
    if "-" in fields[0] and len(fields) >= 5:
        start, end = (int(bound, 16) for bound in fields[0].split("-"))
        mapping = start <= address < end
    elif mapping and fields[0] == "AnonHugePages:":
        huge_kb = int(fields[1])
print(taken, huge_kb)
"""


def _child(mode: str, **env: str) -> tuple[str, int]:
    environment = {key: value for key, value in os.environ.items() if key != VARIABLE} | env
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=environment,
                         timeout=120, check=True).stdout.split()
    return out[0], int(out[1])


def _thp_available() -> bool:
    return THP_MODE.exists() and "[never]" not in THP_MODE.read_text()


@pytest.mark.skipif(not _thp_available(), reason="this kernel gives no transparent huge pages")
def test_asked_before_torch_loads_the_buffers_are_on_huge_pages():
    taken, huge_kb = _child("ask")
    assert taken == "True"
    assert huge_kb >= 32 << 10  # most of the 64 MiB; the kernel may leave a fragmented edge on small pages


@pytest.mark.skipif(not _thp_available(), reason="this kernel gives no transparent huge pages")
def test_a_users_own_setting_stands():
    taken, huge_kb = _child("ask", **{VARIABLE: "0"})
    assert taken == "True"
    if "[always]" not in THP_MODE.read_text():  # then every large mapping may be huge, asked or not
        assert huge_kb == 0


def test_once_torch_is_loaded_nothing_is_promised():
    import torch  # noqa: F401 (this test process has loaded it: asking now cannot change its allocator)

    from ztgi.common.huge_pages import ask_for_huge_pages
    before = os.environ.get(VARIABLE)
    assert ask_for_huge_pages() is False
    assert os.environ.get(VARIABLE) == before
