"""Handing the C heap's free pages back to the OS now and then.

glibc reuses a freed block only for allocations that fit in it. A worker's batches keep changing
shape (KV buffers restacked as requests come and go, activations of every batch size), so its
heap fills with holes that are free but still resident and its RSS creeps up under a mixed load
(BENCHMARKS.md, "The worker process on CPU"). `malloc_trim(0)` returns the whole free pages of
every arena, not only the top of the heap. It walks the free lists, which takes milliseconds
when there is something to give back, so the engine notes when batches shrink or leave (`freed`), the engine
loop trims after the answer of that command is on its way (`release`, off the critical path),
and a trim runs at most once per `min_interval_s`.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

DEFAULT_MIN_INTERVAL_S = 10.0


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None on another C library (musl, macOS): nothing to trim there."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim_heap() -> None:
    """One trim now (after the model is built: a GGUF's codes, unpacked as bytes, were freed)."""
    malloc_trim = _load_malloc_trim()
    if malloc_trim is not None:
        malloc_trim(0)


class HeapTrimmer:
    """`freed()` when memory was freed; `release()` trims if some was and the last trim is
    `min_interval_s` old."""

    def __init__(self, min_interval_s: float = DEFAULT_MIN_INTERVAL_S) -> None:
        self.min_interval_s = min_interval_s
        self.malloc_trim = _load_malloc_trim()
        self.last_trim = time.monotonic()
        self.num_trims = 0
        self.pending = False

    def freed(self) -> None:
        """Memory went back to the heap: the next due `release` trims."""
        self.pending = True

    def release(self) -> bool:
        """Trims if memory was freed since the last trim and it is time; whether it did."""
        now = time.monotonic()
        if self.malloc_trim is None or not self.pending or now - self.last_trim < self.min_interval_s:
            return False
        self.malloc_trim(0)
        self.last_trim = now
        self.num_trims += 1
        self.pending = False
        return True
