"""ztgi's C attention kernels against torch's path, alone, on SmolLM2-135M's attention shapes.

    python -m studies.native_attention_kernels --decode 1x500,16x500 --prefill 0+256,0+740,300+200

`--decode RxC`: R decode rows over contexts spread around C (0.5x to 1.5x), 30 layers' pools;
`--prefill K+N`: a chunk of N tokens after K cached. Blocks are scattered over the pool, as after
churn (`--in-order` hands each request consecutive blocks). Each shape runs the kernels and
torch's gather-and-SDPA path (`PagedAttention` with and without them) in turns, `--repeats`
times; prints the median of each and the ratio. The kernels must build here (AVX512-BF16).
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from ztgi.common.config import ConfigError, parse_config, require
from ztgi.services.worker.kernels.native_attention import NativeAttention
from ztgi.services.worker.layers.attention import AttentionInputs, PagedAttention, PrefillSpan, decode_groups
from ztgi.services.worker.layers.kv_pool import KVPool, KVShape

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, LAYERS = 9, 3, 64, 16, 30


@dataclasses.dataclass(frozen=True)
class KernelsConfig:
    """Which shapes, how many turns."""

    decode: str = dataclasses.field(default="1x500,16x500", metadata={"help": "ROWSxCONTEXT, comma-separated"})
    prefill: str = dataclasses.field(default="0+256,0+740,300+200", metadata={"help": "CACHED+CHUNK, comma-separated"})
    repeats: int = 15
    num_threads: int = 2
    in_order: bool = dataclasses.field(default=False, metadata={"help": "each request's blocks consecutive"})

    def __post_init__(self) -> None:
        require(self.repeats >= 1 and self.num_threads >= 1, "--repeats and --num-threads must be >= 1")
        self.decode_shapes()
        self.prefill_shapes()

    def decode_shapes(self) -> list[tuple[int, int]]:
        return _pairs(self.decode, "x", "--decode")

    def prefill_shapes(self) -> list[tuple[int, int]]:
        return _pairs(self.prefill, "+", "--prefill")


def _pairs(text: str, separator: str, flag: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(n) for n in item.split(separator)) for item in text.split(",") if item]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: comma-separated A{separator}B of integers") from None
    if not all(len(p) == 2 and p[0] >= 0 and p[1] >= 1 for p in pairs):
        raise ConfigError(f"{flag} {text!r}: comma-separated A{separator}B, A >= 0 and B >= 1")
    return [(p[0], p[1]) for p in pairs]


def _pool(lengths: list[int], in_order: bool, seed: int) -> tuple[KVPool, list[list[int]]]:
    counts = [-(-n // BLOCK_SIZE) for n in lengths]
    pool = KVPool(KVShape(LAYERS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, torch.bfloat16), sum(counts) + 1, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    for cache in (*pool.keys, *pool.values):
        cache.copy_(torch.randn(cache.shape, generator=generator))
    order = list(range(1, pool.num_blocks))
    if not in_order:
        random.Random(seed).shuffle(order)
    tables, used = [], 0
    for count in counts:
        tables.append(order[used:used + count])
        used += count
    return pool, tables


def decode_case(rows: int, context: int, in_order: bool) -> tuple[Callable[[PagedAttention], None], str]:
    lengths = [max(1, int(context * (0.5 + i / max(1, rows - 1)))) if rows > 1 else context for i in range(rows)]
    pool, tables = _pool(lengths, in_order, seed=rows * context)
    groups = decode_groups(tables, lengths, BLOCK_SIZE, torch.device("cpu"))
    q = torch.randn(rows, HEADS, HEAD_DIM).to(torch.bfloat16)

    def run(attention: PagedAttention) -> None:
        for layer in range(LAYERS):
            for group in groups:
                attention._decode(layer, q[group.start:group.end], pool, group)
    return run, f"decode {rows} x ~{context}"


def prefill_case(cached: int, chunk: int, in_order: bool) -> tuple[Callable[[PagedAttention], None], str]:
    pool, tables = _pool([cached + chunk], in_order, seed=cached * 7 + chunk)
    span = PrefillSpan(0, chunk, cached, torch.tensor(tables[0]))
    q, k, v = (torch.randn(chunk, heads, HEAD_DIM).to(torch.bfloat16) for heads in (HEADS, KV_HEADS, KV_HEADS))
    slots = torch.tensor([tables[0][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
                          for p in range(cached, cached + chunk)])
    inputs = AttentionInputs(slots, [], [span])

    def run(attention: PagedAttention) -> None:
        for layer in range(LAYERS):
            attention(layer, q, k, v, pool, inputs)
    return run, f"prefill {chunk} after {cached}"


def time_in_turns(run: Callable[[PagedAttention], None], paths: dict[str, PagedAttention],
                  repeats: int) -> dict[str, float]:
    """Median ms of `run` per path; the paths take turns."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats + 1):
        for name, attention in paths.items():
            started = time.perf_counter()
            run(attention)
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values[1:]) * 1e3 for name, values in times.items()}  # the first: warmup


@torch.inference_mode()
def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(KernelsConfig, argv, prog="python -m studies.native_attention_kernels")
    kernels = NativeAttention.load()
    if kernels is None:
        print("the C kernels cannot be built here (see the log): nothing to compare", file=sys.stderr)
        return 1
    torch.set_num_threads(config.num_threads)
    in_place, through_torch = PagedAttention(HEADS, KV_HEADS, HEAD_DIM), PagedAttention(HEADS, KV_HEADS, HEAD_DIM)
    in_place.native = kernels
    cases = ([decode_case(r, c, config.in_order) for r, c in config.decode_shapes()]
             + [prefill_case(k, n, config.in_order) for k, n in config.prefill_shapes()])
    print(f"{LAYERS} layers, {config.num_threads} thread(s), median of {config.repeats} (ms)")
    print(f"{'shape':>24} {'torch':>10} {'in place':>10} {'ratio':>7}")
    for run, name in cases:
        ms = time_in_turns(run, {"torch": through_torch, "in place": in_place}, config.repeats)
        print(f"{name:>24} {ms['torch']:>10.2f} {ms['in place']:>10.2f} {ms['torch'] / ms['in place']:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
