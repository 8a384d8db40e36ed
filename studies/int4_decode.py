"""`--quantize int4` decode on CPU piece by piece: the GGUF block products, and a step's layers in one C call.

    python -m studies.int4_decode --rows 1,4,8,16 --steps 1x64,1x700,4x300,8x64

Products (`--rows`): SmolLM2-135M's 30 layers of q/k/v, output, gate/up and down products (random
weights: the time does not depend on them), as ztgi's 4-bit block products in C
(`Int4BlockLinear`), torch's int4 kernel (`Int4Linear`) and oneDNN's packed bfloat16
(`PackedLinear`); then the lm_head as Q8_0 blocks in C (`Int8BlockLinear`) against packed
bfloat16. Steps (`--steps RxC`): the embedded model with `--quantize int4`, a decode step of R rows
over C cached tokens each, its layers in one C call (`NativeDecodeStack`) against layer by layer
from Python; the two must give bit-identical logits (checked). Everything takes turns (A B A B),
`--repeats` times; medians in ms. Needs a CPU with AVX512-VNNI and AVX512-BF16.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from studies.compiled_forward import call_forward, step_shapes
from ztgi.common.config import ConfigError, parse_config, require
from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.quantization.block_linear import Int4BlockLinear, Int8BlockLinear, quantize_blocks
from ztgi.services.worker.layers.quantization.quantized_linear import Int4Linear, quantize_int4
from ztgi.services.worker.model_loader import load_paged_model
from ztgi.services.worker.models.llama import PagedLlamaForward
from ztgi.services.worker.models.llama_decode_stack import NativeDecodeStack

LAYER_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # SmolLM2-135M: q/k/v, output, gate/up, down
NUM_LAYERS, HEAD_SHAPE = 30, (49152, 576)


@dataclasses.dataclass(frozen=True)
class Int4DecodeConfig:
    """Which row counts and steps, how many turns."""

    rows: str = dataclasses.field(default="1,4,8,16", metadata={"help": "rows per product, comma-separated"})
    steps: str = dataclasses.field(default="1x64,1x700,4x300,8x64", metadata={
        "help": "decode steps ROWSxCONTEXT, comma-separated (empty: none)"})
    repeats: int = 9
    num_threads: int = 2

    def __post_init__(self) -> None:
        require(self.repeats >= 1 and self.num_threads >= 1, "--repeats and --num-threads must be >= 1")
        self.row_counts()
        self.step_shapes()

    def row_counts(self) -> list[int]:
        try:
            counts = [int(n) for n in self.rows.split(",") if n]
        except ValueError:
            raise ConfigError(f"--rows {self.rows!r}: comma-separated integers") from None
        require(all(n >= 1 for n in counts), "--rows must be >= 1")
        return counts

    def step_shapes(self) -> list[tuple[int, int]]:
        try:
            pairs = [tuple(int(n) for n in item.split("x")) for item in self.steps.split(",") if item]
        except ValueError:
            raise ConfigError(f"--steps {self.steps!r}: comma-separated RxC") from None
        require(all(len(p) == 2 and p[0] >= 1 and p[1] >= 1 for p in pairs), "--steps: comma-separated RxC, >= 1")
        return [(p[0], p[1]) for p in pairs]


def in_turns(paths: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms of each path's call; the paths take turns, after one warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats + 1):
        for name, run in paths.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values[1:]) * 1e3 for name, values in times.items()}


def layer_products(rows: list[int], repeats: int) -> None:
    generator = torch.Generator().manual_seed(0)
    paths: dict[str, list[tuple[int, Callable[[torch.Tensor], torch.Tensor]]]] = {"c": [], "torch": [], "bf16": []}
    for out_features, in_features in LAYER_SHAPES * NUM_LAYERS:
        weight = torch.randn(out_features, in_features, generator=generator) * in_features ** -0.5
        groups = quantize_int4(weight, torch.float16)
        block = Int4BlockLinear.load(groups.codes, groups.scales, groups.offsets)
        assert block is not None, "checked by main"
        paths["c"].append((in_features, block))
        paths["torch"].append((in_features, Int4Linear(groups, torch.bfloat16)))
        paths["bf16"].append((in_features, PackedLinear(weight.bfloat16())))
    print(f"{NUM_LAYERS} layers' products (q/k/v, output, gate/up, down), median of {repeats} (ms)")
    print(f"{'rows':>5} {'C blocks':>9} {'torch int4':>11} {'bfloat16':>9} {'vs torch':>9} {'vs bf16':>8}")
    for count in rows:
        inputs = {n: torch.randn(count, n, generator=generator).bfloat16() for n in (576, 1536)}
        ms = in_turns({name: functools.partial(_run_layers, layers, inputs) for name, layers in paths.items()},
                      repeats)
        print(f"{count:>5} {ms['c']:>9.2f} {ms['torch']:>11.2f} {ms['bf16']:>9.2f} {ms['torch'] / ms['c']:>8.2f}x "
              f"{ms['bf16'] / ms['c']:>7.2f}x")


def _run_layers(layers: list[tuple[int, Callable[[torch.Tensor], torch.Tensor]]],
                inputs: dict[int, torch.Tensor]) -> None:
    for in_features, layer in layers:
        layer(inputs[in_features])


def head_products(rows: list[int], repeats: int) -> None:
    weight = torch.randn(*HEAD_SHAPE, generator=torch.Generator().manual_seed(1)) * HEAD_SHAPE[1] ** -0.5
    q8 = Int8BlockLinear.load(*quantize_blocks(weight))
    assert q8 is not None, "checked by main"
    dense = PackedLinear(weight.bfloat16())
    print(f"lm_head {HEAD_SHAPE[0]} x {HEAD_SHAPE[1]}, median of {repeats} (ms)")
    print(f"{'rows':>5} {'Q8_0 in C':>10} {'bfloat16':>9} {'ratio':>7}")
    for count in rows:
        x = torch.randn(count, HEAD_SHAPE[1]).bfloat16()
        ms = in_turns({"q8": functools.partial(q8, x), "bf16": functools.partial(dense, x)}, repeats)
        print(f"{count:>5} {ms['q8']:>10.3f} {ms['bf16']:>9.3f} {ms['bf16'] / ms['q8']:>6.2f}x")


@torch.inference_mode()
def decode_steps(shapes: list[tuple[int, int]], repeats: int) -> int:
    model = load_paged_model("smollm2", dtype="bfloat16", device="cpu", quantize="int4")
    forward = model.forward_pass
    assert isinstance(forward, PagedLlamaForward), "SmolLM2 is a Llama"
    stack = forward.stack
    if stack is None:
        print("the decode stack is not built here (see the log)", file=sys.stderr)
        return 1
    model.allocate_pool(sum(r * (c // model.block_size + 3) for r, c in shapes) + 80)
    print(f"SmolLM2 --quantize int4, a decode step's forward, median of {repeats} (ms)")
    print(f"{'step':>16} {'one C call':>11} {'layer by layer':>15} {'ratio':>7}  logits")
    for rows, context in shapes:
        inputs = step_shapes(model, [rows], 1, context)[f"decode {rows}"]
        run = functools.partial(_forward, model, inputs)
        ms = in_turns({"stack": functools.partial(run, stack), "layers": functools.partial(run, None)}, repeats)
        same = torch.equal(run(stack), run(None))
        print(f"{f'{rows} x {context}':>16} {ms['stack']:>11.2f} {ms['layers']:>15.2f} "
              f"{ms['layers'] / ms['stack']:>6.2f}x  {'bit-identical' if same else 'DIFFER'}")
        if not same:
            return 1
    forward.stack = stack
    return 0


def _forward(model: Any, inputs: Any, stack: NativeDecodeStack | None) -> torch.Tensor:
    model.forward_pass.stack = stack
    return call_forward(model.forward_pass, inputs, model.pool)


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(Int4DecodeConfig, argv, prog="python -m studies.int4_decode")
    if Int8BlockLinear.load(*quantize_blocks(torch.ones(16, 32))) is None:
        print("the block products cannot be built here (see the log): nothing to compare", file=sys.stderr)
        return 1
    torch.set_num_threads(config.num_threads)
    with torch.inference_mode():
        layer_products(config.row_counts(), config.repeats)
        head_products(config.row_counts(), config.repeats)
    return decode_steps(config.step_shapes(), config.repeats) if config.step_shapes() else 0


if __name__ == "__main__":
    sys.exit(main())
