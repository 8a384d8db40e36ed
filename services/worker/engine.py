"""The worker's verbs as engine calls, each answered with one message (no sockets here).

A command that fails answers CommandFailed with the requests it takes down; the worker's other
cached batches are never touched. A bad Decode (an unknown batch id) changes nothing; a Decode
whose step fails drops the batches it named, which are the ones that failed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from ztgi.common.messages import (
    Clear,
    CommandDone,
    CommandFailed,
    Decode,
    Filter,
    FilterResult,
    HealthCheck,
    Prefill,
    SeqUpdate,
    StepResult,
    Timings,
    Warmup,
    WarmupResult,
)
from ztgi.services.worker.backend import Batch, Model, new_batch
from ztgi.services.worker.batch_cache import BatchCache
from ztgi.services.worker.heap_trimmer import HeapTrimmer

logger = logging.getLogger(__name__)


R = TypeVar("R")
COMMANDS = (Warmup, Prefill, Decode, Filter, Clear, HealthCheck)  # the scheduler's verbs

class CommandError(Exception):
    """A command failed; `seq_ids` are the requests it takes down."""

    def __init__(self, error: str, seq_ids: Sequence[int] = ()) -> None:
        super().__init__(error)
        self.seq_ids = list(seq_ids)


class Engine:
    """The model and its cached batches; one method per verb."""

    def __init__(self, model: Model, memory_budget_mb: int, cpu_warmup_prefill_tokens: int | None = None,
                 step_target_ms: int = 500) -> None:
        self.model = model
        self.memory_budget_mb = memory_budget_mb
        self.cpu_warmup_prefill_tokens = cpu_warmup_prefill_tokens
        self.step_target_ms = step_target_ms
        self.cache: BatchCache[Batch] = BatchCache()
        self.heap = HeapTrimmer()  # told by every command that frees a batch's memory

    def run(self, command: object) -> object:
        """The answer to any of the verbs (`COMMANDS`)."""
        match command:
            case Warmup():
                return self.warmup(command)
            case Prefill():
                return self.prefill(command)
            case Decode():
                return self.decode(command)
            case Filter():
                return self.filter(command)
            case Clear():
                return self.clear(command)
            case HealthCheck():
                return self.health_check(command)
        raise AssertionError(f"not a command: {command!r}")

    def warmup(self, command: Warmup) -> WarmupResult | CommandFailed:
        def run() -> WarmupResult:
            self.cache.clear()
            return self.model.warmup(command, self.memory_budget_mb, self.cpu_warmup_prefill_tokens,
                                     self.step_target_ms)
        return self._guarded(command.command_id, run)

    def prefill(self, command: Prefill) -> StepResult | CommandFailed:
        """A new batch's first step; on a paged worker joined by the cached batches it names, so
        their decodes and prefill chunks run in the same forward (cached under the first)."""
        seq_ids = [r.seq_id for r in command.batch.requests]

        def run() -> StepResult:
            spec = command.batch
            if spec.batch_id in self.cache or spec.batch_id in command.batch_ids:
                raise CommandError(f"batch {spec.batch_id} is already cached", seq_ids)
            batch = new_batch(self.model, spec.requests, spec.batch_id, spec.max_tokens)
            if not command.batch_ids:
                if command.updates:
                    raise CommandError("updates given without cached batches", seq_ids)
                return self._step(command.command_id, batch, concatenate_ns=0)
            return self._joined_step(command.command_id, command.batch_ids, command.updates, batch)
        return self._guarded(command.command_id, run, seq_ids)

    def decode(self, command: Decode) -> StepResult | CommandFailed:
        """One step of the named batches, concatenated first; batches that ended meanwhile (a
        Decode sent ahead of the answer that ended them) are left out, and with none left the
        answer is an empty step."""
        def run() -> StepResult:
            if not command.batch_ids:
                raise CommandError("no batch ids given")
            batch_ids = [batch_id for batch_id in command.batch_ids if not self.cache.has_ended(batch_id)]
            if not batch_ids:
                return StepResult(command.command_id, [], None, Timings())
            return self._joined_step(command.command_id, batch_ids, command.updates)
        return self._guarded(command.command_id, run)

    def _joined_step(self, command_id: int, batch_ids: Sequence[int], updates: Sequence[SeqUpdate],
                     newcomer: Batch | None = None) -> StepResult:
        """One step of the cached batches (updates applied first) and a new batch, concatenated
        under the first id. Bad input changes nothing; a step that fails drops every batch in it."""
        batches = self._cached(batch_ids)
        self._apply(batches, updates)
        joined = [*batches, newcomer] if newcomer is not None else batches
        started = time.perf_counter_ns()
        try:
            batch = self.model.batch_type.concatenate(joined)
            concatenate_ns = time.perf_counter_ns() - started
            result = self._step(command_id, batch, concatenate_ns)
        except Exception as exc:
            logger.exception("step of batches %s failed: dropping them", list(batch_ids))
            for batch_id in batch_ids:
                self.cache.delete(batch_id)
            raise CommandError(_describe(exc), [rid for b in joined for rid in b.seq_ids]) from exc
        for batch_id in batch_ids[1:]:
            self.cache.delete(batch_id)
        if len(joined) > 1 or result.batch is None:  # buffers restacked or released
            self.heap.freed()
        return result

    @staticmethod
    def _apply(batches: Sequence[Batch], updates: Sequence[SeqUpdate]) -> None:
        """Hands each batch its requests' updates; CommandError (nothing changed) for a request in
        none of them. Each batch checks its own before changing anything."""
        if not updates:
            return
        owner = {rid: batch for batch in batches for rid in batch.seq_ids}
        unknown = [u.seq_id for u in updates if u.seq_id not in owner]
        if unknown:
            raise CommandError(f"updates for requests {unknown} that are not in the batches stepped")
        if len({u.seq_id for u in updates}) != len(updates):
            raise CommandError(f"repeated updates for requests in {[u.seq_id for u in updates]}")
        bad = [u.seq_id for u in updates if u.chunk_len is not None and u.chunk_len < 1]
        if bad:
            raise CommandError(f"updates of requests {bad}: `chunk_len` must be >= 1")
        for batch in batches:
            batch.apply([u for u in updates if owner[u.seq_id] is batch])

    def filter(self, command: Filter) -> FilterResult | CommandFailed:
        def run() -> FilterResult:
            [batch] = self._cached([command.batch_id])
            filtered = batch.filter(command.seq_ids)
            if filtered is None:
                self.cache.end(command.batch_id)
            else:
                self.cache.set(command.batch_id, filtered)
            self.heap.freed()
            return FilterResult(command.command_id, filtered.to_cached() if filtered else None)
        return self._guarded(command.command_id, run)

    def clear(self, command: Clear) -> CommandDone:
        if command.batch_id is None:
            self.cache.clear()
        else:
            self.cache.delete(command.batch_id)
        self.heap.freed()
        return CommandDone(command.command_id)

    def health_check(self, command: HealthCheck) -> CommandDone:
        return CommandDone(command.command_id)

    def release_freed_memory(self) -> None:
        """Housekeeping that no answer waits for: run after a command's answer has been sent."""
        self.heap.release()

    # -- helpers -------------------------------------------------------------------------------

    def _step(self, command_id: int, batch: Batch, concatenate_ns: int) -> StepResult:
        """One generate_token; the next batch replaces `batch` in the cache (or leaves it)."""
        started = time.perf_counter_ns()
        generations, next_batch, timings = self.model.generate_token(batch)
        if next_batch is None:
            self.cache.end(batch.batch_id)
        else:
            self.cache.set(batch.batch_id, next_batch)
        total_ns = time.perf_counter_ns() - started + concatenate_ns
        timings = dataclasses.replace(timings, concatenate_ns=concatenate_ns, total_ns=total_ns)
        return StepResult(command_id, generations, next_batch.to_cached() if next_batch else None, timings)

    def _cached(self, batch_ids: Sequence[int]) -> list[Batch]:
        """The cached batches, or CommandError (nothing changed) when one is unknown."""
        if not batch_ids:
            raise CommandError("no batch ids given")
        if len(set(batch_ids)) != len(batch_ids):
            raise CommandError(f"batch ids {list(batch_ids)} repeat")
        found = {batch_id: batch for batch_id in batch_ids if (batch := self.cache.get(batch_id)) is not None}
        missing = [batch_id for batch_id in batch_ids if batch_id not in found]
        if missing:
            raise CommandError(f"unknown batch ids {missing} (cached: {sorted(self.cache)})")
        return [found[batch_id] for batch_id in batch_ids]

    def _guarded(self, command_id: int, run: Callable[[], R],
                 seq_ids: Sequence[int] = ()) -> R | CommandFailed:
        """Runs a command; any exception becomes CommandFailed naming the requests it takes down."""
        try:
            return run()
        except CommandError as exc:
            logger.warning("command %d failed: %s", command_id, exc)
            return CommandFailed(command_id, str(exc), exc.seq_ids)
        except ValueError as exc:  # bad input: the message names the request and field
            logger.warning("command %d rejected: %s", command_id, exc)
            return CommandFailed(command_id, str(exc), list(seq_ids))
        except Exception as exc:
            logger.exception("command %d failed", command_id)
            return CommandFailed(command_id, _describe(exc), list(seq_ids))


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
