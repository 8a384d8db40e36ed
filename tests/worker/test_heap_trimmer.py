"""The heap trimmer: glibc's malloc_trim at most once per interval."""

from __future__ import annotations

from ztgi.services.worker.heap_trimmer import HeapTrimmer


def test_trims_only_once_the_interval_has_passed() -> None:
    trimmer = HeapTrimmer(min_interval_s=3600.0)
    assert trimmer.malloc_trim is not None  # the project's Linux machines run glibc
    trimmer.freed()
    assert not trimmer.release() and trimmer.num_trims == 0  # the interval counts from start-up


def test_trims_once_per_freeing_without_an_interval() -> None:
    trimmer = HeapTrimmer(min_interval_s=0.0)
    assert not trimmer.release()  # nothing was freed yet
    trimmer.freed()
    assert trimmer.release() and not trimmer.release()
    trimmer.freed()
    assert trimmer.release()
    assert trimmer.num_trims == 2
