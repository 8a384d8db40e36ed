"""How much faster could a GGUF's block products get by trimming their float arithmetic?

    python -m studies.product_bound /work/models/llama-1b-Q4_K_M.gguf --rows 16 --steps 20

Runs `block_linear.c` as the worker builds it against a build of it with each sub-block's term
(`add_term`: the integer dot to float, times the row's step and the weights' scale, plus the
offset's term) replaced by one integer add. What is left is the VNNI dot products, the unpacking of
the weights' codes and the loads: a bound on any epilogue, not a product (its outputs are wrong).
Every layer's products and the head, packed as the served model packs them
(`studies.block_step_bytes`), run `--rows` bfloat16 rows through both builds in one process, steps
alternated; medians per product kind. Where the bound is close to 1, the scales are not what holds
the product back. It needs the CPU `block_linear.c` needs (AVX512-VNNI and BF16).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import gguf
import torch

from studies.block_step_bytes import PRODUCTS, _layer
from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.kernels.native_library import Kernel
from ztgi.services.worker.layers.quantization.block_linear import BlockLinear, kernels_of

SOURCE = native_library.SOURCE_DIR / "block_linear.c"
# add_term's whole definition, from its signature to the closing brace at the start of a line
ADD_TERM = re.compile(r"ALWAYS_INLINE __m512 add_term\((?P<params>[^)]*)\) \{\n.*?\n\}\n", re.DOTALL)
INTEGER_ADD = "    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(sums), dot));\n"


def without_scales(source: str) -> str:
    """`block_linear.c` with each sub-block's float term replaced by an integer add of the dot."""
    found = ADD_TERM.search(source)
    if found is None:
        raise SystemExit(f"no add_term in {SOURCE}: this study follows its definition")
    replacement = f"ALWAYS_INLINE __m512 add_term({found['params']}) {{\n{INTEGER_ADD}}}\n"
    return source[:found.start()] + replacement + source[found.end():]


def build_bound(directory: Path) -> tuple[Kernel, Kernel]:
    """The product and de-quantizing of `without_scales`' source, built in `directory`."""
    path = directory / "no_scales.c"
    path.write_text(without_scales(SOURCE.read_text()))
    target = directory / "no_scales.so"
    native_library.build(native_library.find_compiler(), path, target)
    return kernels_of(ctypes.CDLL(str(target)))


def layers_by_kind(gguf_file: str) -> dict[str, list[BlockLinear]]:
    tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(gguf_file).tensors}
    count = 1 + max(int(name.split(".")[1]) for name in tensors if name.startswith("blk."))
    kinds: dict[str, list[BlockLinear]] = collections.defaultdict(list)
    for i in range(count):
        for kind, parts in PRODUCTS.items():
            kinds[kind].append(_layer(tensors, [f"blk.{i}.{part}.weight" for part in parts]))
    kinds["head"].append(_layer(tensors, ["output.weight" if "output.weight" in tensors else "token_embd.weight"]))
    return kinds


def time_kinds(kinds: dict[str, list[BlockLinear]], kernels: dict[str, tuple[Kernel, Kernel]], rows: int,
               steps: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per step of each kind's products, per build, the builds taking turns each step."""
    inputs = {layer.in_features: torch.randn(rows, layer.in_features).to(torch.bfloat16)
              for layer_list in kinds.values() for layer in layer_list}
    times: dict[str, dict[str, list[float]]] = {name: collections.defaultdict(list) for name in kernels}
    for step in range(steps + 2):  # two warm-up steps
        for name, pair in kernels.items():
            for kind, layer_list in kinds.items():
                for layer in layer_list:
                    layer._kernel, layer._dequantize = pair
                start = time.perf_counter()
                for layer in layer_list:
                    layer(inputs[layer.in_features])
                if step >= 2:
                    times[name][kind].append(time.perf_counter() - start)
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf_file")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    kinds = layers_by_kind(args.gguf_file)
    built = kinds["head"][0]
    with tempfile.TemporaryDirectory() as directory:
        kernels = {"as built": (built._kernel, built._dequantize), "no scales": build_bound(Path(directory))}
        times = time_kinds(kinds, kernels, args.rows, args.steps)
    print(f"{args.rows} rows, medians of {args.steps} alternated steps")
    print(f"{'kind':8s} {'as built ms':>12s} {'no scales ms':>13s} {'ratio':>6s}")
    totals = {name: 0.0 for name in kernels}
    for kind in kinds:
        medians = {name: statistics.median(times[name][kind]) for name in kernels}
        for name in kernels:
            totals[name] += medians[name]
        print(f"{kind:8s} {medians['as built'] * 1e3:12.2f} {medians['no scales'] * 1e3:13.2f} "
              f"{medians['no scales'] / medians['as built']:6.3f}")
    print(f"{'all':8s} {totals['as built'] * 1e3:12.2f} {totals['no scales'] * 1e3:13.2f} "
          f"{totals['no scales'] / totals['as built']:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
