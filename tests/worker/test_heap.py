"""The heap trimmer: glibc's malloc_trim at most once per interval."""

from __future__ import annotations

from services.worker.heap import HeapTrimmer


def test_trims_only_once_the_interval_has_passed() -> None:
    trimmer = HeapTrimmer(min_interval_s=3600.0)
    assert trimmer.malloc_trim is not None  # the project's Linux machines run glibc
    assert not trimmer.release() and trimmer.num_trims == 0  # the interval counts from start-up


def test_every_release_trims_without_an_interval() -> None:
    trimmer = HeapTrimmer(min_interval_s=0.0)
    assert trimmer.release() and trimmer.release()
    assert trimmer.num_trims == 2
