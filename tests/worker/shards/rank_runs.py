"""Rank processes for the shard tests: each joins a real gloo group and runs the same job (loading
its share of a model with `load_model(group=...)` and stepping requests), as a worker group's ranks do."""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Callable

import torch

from ztgi.services.worker.shards.shard_group import GroupAddress, ShardGroup

Job = Callable[[ShardGroup], object]  # what one rank runs (a module-level function or a partial of one)


def run_in_group(size: int, job: Job) -> list[object]:
    """Each rank's result of `job(group)` (rank order), every rank in a process of its own."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    processes = [context.Process(target=_rank, args=(rank, size, port, job, results))
                 for rank in range(size)]
    for process in processes:
        process.start()
    try:
        answers = dict(results.get(timeout=240) for _ in processes)
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
    failed = {rank: answer for rank, answer in answers.items() if isinstance(answer, str)}
    assert not failed, failed
    return [answers[rank] for rank in range(size)]


def _rank(rank: int, size: int, port: int, job: Job, results: multiprocessing.Queue) -> None:
    torch.set_num_threads(1)
    try:
        group = ShardGroup(rank, size, GroupAddress("127.0.0.1", port), 60.0, torch.device("cpu"))
        results.put((rank, job(group)))
        group.close()
    except BaseException as exc:  # reported, not raised: the test names the rank that failed
        results.put((rank, f"{type(exc).__name__}: {exc}"))
