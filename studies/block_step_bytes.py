"""A GGUF's block layers as the C product holds them: bytes per decode step, and one row's time
through the first layer's four products (q/k/v, o, gate/up, down).

    python -m studies.block_step_bytes /work/models/llama-1b-Q4_K_M.gguf --threads 1

Builds each layer from the file's tensors as the served model does (`BlockLinear.load_stacked`:
parts of one kind stacked, parts of different kinds side by side), without loading the model. The
bytes cover every layer's four products and the head. One row in bfloat16, after a warm-up, timed
`--repeats` times: minimum and median (the first layer's weights fit the caches of a large CPU:
these are the products' compute, not the memory's).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import gguf
import torch

from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.block_linear import BlockLinear
from ztgi.services.worker.layers.quantization.gguf_blocks import block_codes

PRODUCTS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
            "down": ("ffn_down",)}


def _codes(tensor: gguf.ReaderTensor) -> BlockCodes:
    codes = block_codes(int(tensor.tensor_type), tensor.data, int(tensor.shape[1]), int(tensor.shape[0]))
    if codes is None:
        raise SystemExit(f"{tensor.name}: {tensor.tensor_type.name} has no block product")
    return codes


def _layer(tensors: dict[str, gguf.ReaderTensor], names: Sequence[str]) -> BlockLinear:
    layer = BlockLinear.load_stacked([_codes(tensors[name]) for name in names])
    if layer is None:
        raise SystemExit("the C block product cannot run here")
    return layer


def step_bytes(tensors: dict[str, gguf.ReaderTensor]) -> tuple[int, int]:
    """The packed bytes and the weights of every layer's products and the head."""
    count = 1 + max(int(name.split(".")[1]) for name in tensors if name.startswith("blk."))
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    groups = [[f"blk.{i}.{part}.weight" for part in parts] for i in range(count) for parts in PRODUCTS.values()]
    total = weights = 0
    for names in [*groups, [head]]:
        layer = _layer(tensors, names)
        total += layer.nbytes
        weights += layer.out_features * layer.in_features
    return total, weights


def row_times(layer: BlockLinear, repeats: int) -> list[float]:
    x = torch.randn(1, layer.in_features).to(torch.bfloat16)
    for _ in range(20):
        layer(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        layer(x)
        times.append(time.perf_counter() - start)
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf_file")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(args.gguf_file).tensors}
    total, weights = step_bytes(tensors)
    print(f"packed {total / 1e6:.1f} MB per step, {8 * total / weights:.3f} bits per weight "
          f"({weights / 1e6:.1f} M weights)")
    for name, parts in PRODUCTS.items():
        layer = _layer(tensors, [f"blk.0.{part}.weight" for part in parts])
        times = row_times(layer, args.repeats)
        kinds = "+".join(f"{lay.bits}b/{lay.sub_block}" for lay in layer.layouts)
        print(f"{name:8s} {layer.out_features}x{layer.in_features} {kinds:12s} {layer.nbytes / 1e6:6.2f} MB  "
              f"min {min(times) * 1e6:8.1f} us  median {statistics.median(times) * 1e6:8.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
