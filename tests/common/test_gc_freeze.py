"""Freezing start-up objects: they leave the collector's walk, later garbage is still collected."""

from __future__ import annotations

import gc
import weakref

from ztgi.common.gc_freeze import freeze_startup_objects


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> tuple[_Node, weakref.ref]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


def test_start_up_objects_are_frozen_and_later_cycles_collected() -> None:
    node, frozen = _cycle()
    try:
        assert freeze_startup_objects() > 0
        del node  # garbage now, but frozen: no collection walks it
        gc.collect()
        assert frozen() is not None
        node, later = _cycle()
        del node
        gc.collect()
        assert later() is None
    finally:
        gc.unfreeze()
