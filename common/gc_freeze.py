"""Keeping the objects a service starts with out of Python's cyclic garbage collector.

A full collection walks every tracked object, and after start-up a service holds hundreds of
thousands of them (the vocabulary, transformers' modules: BENCHMARKS.md has the counts and times).
CPython runs a full collection whenever enough new objects have survived, which under load lands
in the middle of a step: every stream that waits on that process stalls. `gc.freeze()` moves
everything alive now into a permanent generation that collections skip; objects made later are
collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collects once, then freezes every surviving object; how many are now frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
