"""One linear layer in every weight format the CPU worker can serve, timed at a server's row counts.

    python -m studies.linear_kernels --rows 1,16,128,512 --repeats 5

For each of SmolLM2-135M's matrix shapes (fused q/k/v, attention output, fused gate/up, down,
lm_head) and each row count (decode at batch 1 and 16, prefill chunks), the median time of
`y = x @ W.T` with W as:

- `float32`: the worker's float layer (`PackedLinear`: the C rows product for a decode step's rows
  where the CPU has AVX2, oneDNN otherwise)
- `bfloat16`: the same, weight and activations in bfloat16 (avx512_bf16 / AMX)
- `int8-f32`, `int8-bf16`: `torch._weight_int8pack_mm`: int8 weight, one scale per output row, activations
  float32 / bfloat16
- `int4-f32`, `int4-bf16`: `torch._weight_int4pack_mm_for_cpu`: 4-bit weight, a scale and an offset per 32 inputs
  (GGUF Q4_1's layout)
- `w8a8-dynamic`: fbgemm's `quantized::linear_dynamic`: int8 weight and int8 activations quantized per call (for
  reference only: it rounds the activations too)

Prints one JSON line per (shape, rows) with each format's milliseconds, and a table.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ztgi.common.config import ConfigError, parse_config, require
from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.quantization.quantized_linear import Int4Linear, Int8Linear

SHAPES = {  # name: (out_features, in_features), SmolLM2-135M
    "qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


@dataclasses.dataclass(frozen=True)
class LinearKernelsConfig:
    """Times of one matrix product per weight format, shape and row count."""

    rows: str = dataclasses.field(default="1,16,128,512", metadata={"help": "row counts (tokens per step)"})
    shapes: str = dataclasses.field(default=",".join(SHAPES), metadata={"help": "which of " + ",".join(SHAPES)})
    formats: str = dataclasses.field(default="float32,bfloat16,int8-bf16,int4-bf16,w8a8-dynamic",
                                     metadata={"help": "weight formats to time"})
    repeats: int = dataclasses.field(default=5, metadata={"help": "timed batches per format; the fastest is reported"})
    min_time_s: float = dataclasses.field(default=0.02, metadata={"help": "each timed batch runs at least this long"})
    num_threads: int | None = None

    def __post_init__(self) -> None:
        require(self.repeats >= 1, "--repeats must be >= 1")
        require(all(s in SHAPES for s in self.shapes.split(",")), f"--shapes must be among {','.join(SHAPES)}")


def kernel(fmt: str, weight: torch.Tensor) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.dtype]:
    """The layer of `fmt` built from the float32 `weight`, and the activations' dtype."""
    if fmt == "float32":
        return PackedLinear(weight), torch.float32
    if fmt == "bfloat16":
        return PackedLinear(weight.bfloat16()), torch.bfloat16
    if fmt.startswith("int8-"):
        dtype = torch.float32 if fmt.endswith("f32") else torch.bfloat16
        return Int8Linear.from_float(weight, dtype), dtype
    if fmt.startswith("int4-"):
        dtype = torch.float32 if fmt.endswith("f32") else torch.bfloat16
        return Int4Linear.from_float(weight, dtype), dtype
    if fmt == "w8a8-dynamic":
        scale = weight.abs().amax().item() / 127
        qweight = torch.quantize_per_tensor(weight, scale, 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qweight, None)
        return (lambda x: torch.ops.quantized.linear_dynamic(x, packed, True)), torch.float32
    raise ConfigError(f"unknown format {fmt!r}")


def batch_seconds(fn: Callable[[], object], min_time_s: float) -> tuple[int, float]:
    """How many calls fill `min_time_s` (at least 1), after one untimed call."""
    fn()
    count, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < min_time_s:
        fn()
        count += 1
    return count, elapsed / count


def fastest_ms(fns: Mapping[str, Callable[[], object]], repeats: int, min_time_s: float) -> dict[str, float]:
    """Each function's fastest batch, in ms per call; the functions take turns batch by batch, so a
    machine shared with other work slows them alike, and the minimum keeps the quiet moments."""
    sizes = {name: batch_seconds(fn, min_time_s)[0] for name, fn in fns.items()}
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            started = time.perf_counter()
            for _ in range(sizes[name]):
                fn()
            best[name] = min(best[name], (time.perf_counter() - started) / sizes[name])
    return {name: round(seconds * 1e3, 4) for name, seconds in best.items()}


@torch.inference_mode()
def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(LinearKernelsConfig, argv, prog="python -m studies.linear_kernels")
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    formats = config.formats.split(",")
    rows_list = [int(r) for r in config.rows.split(",")]
    generator = torch.Generator().manual_seed(0)
    table: list[dict[str, Any]] = []
    for shape in config.shapes.split(","):
        out_features, in_features = SHAPES[shape]
        weight = torch.randn(out_features, in_features, generator=generator) * in_features ** -0.5
        layers = {fmt: kernel(fmt, weight) for fmt in formats}
        for rows in rows_list:
            x = torch.randn(rows, in_features, generator=generator)
            fns = {fmt: functools.partial(layer, x.to(dtype)) for fmt, (layer, dtype) in layers.items()}
            result = {"shape": shape, "rows": rows, **fastest_ms(fns, config.repeats, config.min_time_s)}
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
            table.append(result)
    header = f"{'shape':>8} {'rows':>5} " + " ".join(f"{fmt:>12}" for fmt in formats)
    sys.stdout.write(header + "   (ms, fastest of --repeats)\n")
    for result in table:
        sys.stdout.write(f"{result['shape']:>8} {result['rows']:>5} "
                         + " ".join(f"{result[fmt]:>12.3f}" for fmt in formats) + "\n")
    for rows in rows_list:
        sys.stdout.write(f"{'all':>8} {rows:>5} " + " ".join(
            f"{sum(r[fmt] for r in table if r['rows'] == rows):>12.3f}" for fmt in formats) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
