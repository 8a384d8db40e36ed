"""A worker group of two ranks (one core and one thread each) against one worker with two threads,
side by side on the mixed set, and the collectives' share of a sharded decode step.

    python -m studies.shard_throughput --repeats 2

The model: SmolLM2-135M's shape (30 layers, hidden 576, intermediate 1536, its vocabulary and
tokenizer) with 8 query and 4 KV heads instead of 9 and 3, which do not split in two; random
weights, bfloat16. Throughput: each repeat launches it as `--num-shard 1` then `--num-shard 2`,
one at a time, and runs the same closed-loop load on the built-in mixed set at
`--concurrency`; output tokens/s per run, each system's median and the median of the repeats'
sharded/single ratios go to stdout.

Collectives: two ranks in processes of their own load their shares and run decode steps of a
16-request batch; the time inside the group's all-reduces and all-gather (timed around each call)
over the step's time.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from ztgi.bench.bench import run_event_loop
from ztgi.bench.config import BenchConfig
from ztgi.bench.launched_server import LaunchedServer
from ztgi.bench.load_generator import LoadGenerator
from ztgi.bench.workload import MIXED_DATASET_PATH, load_dataset
from ztgi.common.free_ports import free_port
from ztgi.common.messages import SamplingParameters, Warmup, WorkerRequest
from ztgi.common.model_source import resolve_model
from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.paged.batch import PagedBatch
from ztgi.services.worker.paged.model import PagedModel
from ztgi.services.worker.shards.shard_group import GroupAddress, ShardGroup

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--decode-steps", type=int, default=40)
    return parser.parse_args()


def save_model(directory: str) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    source = resolve_model().path
    config = LlamaConfig.from_pretrained(source)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 8, 4, 72
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.to(dtype=torch.bfloat16)  # type: ignore[call-arg]  # transformers' stub misreads nn.Module.to
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), directory)
    return directory


def throughput(model_dir: str, num_shard: int, concurrency: int) -> float:
    flags = ["--model-id", model_dir, "--num-shard", str(num_shard)]
    with LaunchedServer(flags) as server:
        config = BenchConfig(url=server.url, concurrency=concurrency, progress=False)
        prompts = load_dataset(MIXED_DATASET_PATH)
        run_event_loop(LoadGenerator(config, prompts[:concurrency]).run(concurrency))  # warm
        result = run_event_loop(LoadGenerator(config, prompts).run(concurrency))
        assert result.summary.num_failures == 0, result.summary
        return result.summary.output_token_throughput


class TimedGroup:
    """Seconds spent inside the group's collectives."""

    def __init__(self, group: ShardGroup) -> None:
        self.seconds = 0.0
        for name in ("all_reduce", "all_gather_last"):
            setattr(group, name, self._timed(getattr(group, name)))

    def _timed(self, collective: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def call(*args: torch.Tensor) -> torch.Tensor:
            started = time.perf_counter()
            try:
                return collective(*args)
            finally:
                self.seconds += time.perf_counter() - started
        return call


def decode_share(model_dir: str, steps: int, group: ShardGroup) -> tuple[float, float]:
    """(ms per decode step of 16 requests, the collectives' share of it) on this rank."""
    timer = TimedGroup(group)
    model = load_model(model_dir, kv_cache="paged", group=group)
    assert isinstance(model, PagedModel)
    model.warmup(Warmup(1, 256, 512, 512, None), 256, 512, 500)
    blocks = -(-(32 + steps + 2) // model.block_size)
    requests = [WorkerRequest(i, [1, 100 + i, 200, 300 + i] * 8, SamplingParameters(), steps + 2, True,
                              block_ids=list(range(i * blocks, (i + 1) * blocks))) for i in range(16)]
    batch: PagedBatch | None = model.batch_type.from_requests(requests, 1, 16 * (34 + steps), model)
    for step in range(steps + 1):
        assert batch is not None
        if step == 1:  # after the prefill
            timer.seconds, started = 0.0, time.perf_counter()
        batch = model.generate_token(batch)[1]
    elapsed = time.perf_counter() - started
    return 1000 * elapsed / steps, timer.seconds / elapsed


def in_group(size: int, job: Callable[[ShardGroup], tuple[float, float]]) -> list[tuple[float, float]]:
    """`job(group)` on each rank of a gloo group, in processes of their own."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_rank, args=(rank, size, port, job, results)) for rank in range(size)]
    for process in processes:
        process.start()
    answers = dict(results.get(timeout=600) for _ in processes)
    for process in processes:
        process.join()
    return [answers[rank] for rank in range(size)]


def _rank(rank: int, size: int, port: int, job: Callable[[ShardGroup], tuple[float, float]],
          results: multiprocessing.Queue) -> None:
    torch.set_num_threads(1)
    os.sched_setaffinity(0, [rank % (os.cpu_count() or 1)])
    group = ShardGroup(rank, size, GroupAddress("127.0.0.1", port), 60.0, torch.device("cpu"))
    results.put((rank, job(group)))


def main() -> None:
    args = parse_args()
    model_dir = save_model(tempfile.mkdtemp(prefix="shard-model-"))
    shares = in_group(2, functools.partial(decode_share, model_dir, args.decode_steps))
    for rank, (step_ms, share) in enumerate(shares):
        print(f"rank {rank}: decode step of 16 {step_ms:.1f} ms, collectives {100 * share:.0f}% of it", flush=True)
    rates: dict[int, list[float]] = {1: [], 2: []}
    for repeat in range(args.repeats):
        for num_shard in (1, 2):
            rates[num_shard].append(throughput(model_dir, num_shard, args.concurrency))
            print(f"repeat {repeat + 1} --num-shard {num_shard}: {rates[num_shard][-1]:.1f} output tok/s", flush=True)
    ratios = [two / one for one, two in zip(rates[1], rates[2], strict=True)]
    print(f"median: one worker {statistics.median(rates[1]):.1f} tok/s, two shards {statistics.median(rates[2]):.1f} "
          f"tok/s; sharded/single {statistics.median(ratios):.2f}x (repeats {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
