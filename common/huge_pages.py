"""A CPU worker's weights on 2 MiB pages (the worker's entry points ask for them before torch loads).

A decode step reads every weight once: hundreds of MB in 4 KiB pages are a TLB miss every 4 KiB,
each a page walk, and under a hypervisor a walk of two page tables. torch's CPU allocator asks the
kernel for transparent huge pages on its large buffers (`madvise(MADV_HUGEPAGE)`, 2 MiB aligned)
when `THP_MEM_ALLOC_ENABLE` is set, and reads that variable once, at its first allocation: it
must be in the environment before torch is imported. Where the kernel's THP mode is `never` the
advice is ignored and nothing changes.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "THP_MEM_ALLOC_ENABLE"


def ask_for_huge_pages() -> bool:
    """Sets `THP_MEM_ALLOC_ENABLE=1` unless the environment already says (a user's `0` stands);
    returns whether torch will take it: False where torch is already imported (an in-process engine
    in a program that loaded torch first keeps its allocator as it is)."""
    if "torch" in sys.modules:
        return False
    os.environ.setdefault(VARIABLE, "1")
    return True
