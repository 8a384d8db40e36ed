"""The machine's limits on paper for a model served as stored: what a decode step and a prefill cost
at the measured memory bandwidth and matrix peak, beside which the served figures are judged.

    python -m studies.machine_limits --model-id /work/models/llama-1b-Q4_K_M.gguf --prompt-tokens 190

Measured here, on all the cores torch uses: the bandwidth of reading a 1 GiB tensor (a sum over it,
best of 5), and the float and int8 matrix products' rates on a prefill-shaped product (512 rows
through a 2048 x 8192 weight, best of 5), each by the fastest kernel torch has for this CPU: the
float product in bfloat16 where the CPU has bfloat16 units, else in float32 through the worker's own
float layer (`PackedLinear`: oneDNN at a prefill's rows); int8 by oneDNN's VNNI product
(`torch._int_mm`) where the CPU has VNNI, else by fbgemm's (`vpmaddubsw` on AVX2): the rate the
block products' integer dots are judged against. Without VNNI `torch._int_mm` has no vector kernel
(under 1 GOP/s), which would judge the products against nothing. The model's bytes per decode
step are its packed layers as the worker holds them (`--quantize gguf`), read once per step
whatever the batch; its FLOPs per token are two per weight. The limits: decode steps per second
<= bandwidth / bytes per step (times the rows of a step for tokens per second, while the step stays
memory-bound), prefill tokens per second <= float matrix rate / FLOPs per token, and a decode step
of `--step-rows` rows takes at least the longer of reading the layers and their int8 products.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Callable, Sequence

import torch

from ztgi.services.worker.kernels.native_library import cpu_flags
from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.quantization.block_linear import BlockLinear
from ztgi.services.worker.model_loader import load_paged_model
from ztgi.services.worker.models.dtype_choice import auto_dtype
from ztgi.services.worker.models.llama import PagedLlamaForward


def best_seconds(work: Callable[[], object], repeats: int = 5) -> float:
    work()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def read_bandwidth(num_bytes: int = 1 << 30) -> float:
    """Bytes per second of reading a float32 tensor once (a sum over it)."""
    values = torch.ones(num_bytes // 4)
    return num_bytes / best_seconds(lambda: values.sum())


VNNI = ("avx512_vnni", "avx_vnni")


def float_matrix_dtype() -> torch.dtype:
    """The CPU's serving dtype (`--dtype auto`): bfloat16 where it has bfloat16 units, else float32."""
    return auto_dtype(torch.device("cpu"))


def float_matrix_rate(rows: int = 512, inputs: int = 2048, outputs: int = 8192,
                      dtype: torch.dtype | None = None) -> float:
    """FLOPs per second of a `[rows, inputs] @ [inputs, outputs]` in `dtype` (`float_matrix_dtype`),
    float32 through the worker's float layer."""
    dtype = dtype or float_matrix_dtype()
    x, weight = torch.randn(rows, inputs).to(dtype), torch.randn(inputs, outputs).to(dtype)
    if dtype is torch.float32:
        layer = PackedLinear(weight.T)
        return 2 * rows * inputs * outputs / best_seconds(lambda: layer(x))
    return 2 * rows * inputs * outputs / best_seconds(lambda: x @ weight)


def int8_matrix_rate(rows: int = 512, inputs: int = 2048, outputs: int = 8192) -> float:
    """Integer operations (a multiply and an add each) per second of an int8 `[rows, inputs] @ [inputs, outputs]`."""
    if not cpu_flags() & set(VNNI):
        return _fbgemm_int8_rate(rows, inputs, outputs)
    x = torch.randint(-127, 128, (rows, inputs), dtype=torch.int8)
    weight = torch.randint(-127, 128, (inputs, outputs), dtype=torch.int8)
    return 2 * rows * inputs * outputs / best_seconds(lambda: torch._int_mm(x, weight))


def _fbgemm_int8_rate(rows: int, inputs: int, outputs: int) -> float:
    """fbgemm's quantized linear: unsigned 8-bit rows against signed 8-bit weights, int32 sums."""
    with warnings.catch_warnings():  # torch's quantized tensors are deprecated; fbgemm's kernel is the measure
        warnings.simplefilter("ignore", UserWarning)
        weight = torch.quantize_per_tensor(torch.randn(outputs, inputs), 0.05, 0, torch.qint8)
        x = torch.quantize_per_tensor(torch.randn(rows, inputs), 0.05, 64, torch.quint8)
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    try:
        packed = torch.ops.quantized.linear_prepack(weight, None)
        return 2 * rows * inputs * outputs / best_seconds(lambda: torch.ops.quantized.linear(x, packed, 0.1, 64))
    finally:
        torch.backends.quantized.engine = engine


def packed_bytes(model_id: str) -> tuple[int, int]:
    """The bytes of the model's packed block layers as the worker holds them, and its weights."""
    model = load_paged_model(model_id, dtype="bfloat16", device="cpu", quantize="gguf")
    forward = model.forward_pass
    assert isinstance(forward, PagedLlamaForward), "served as stored: a Llama"
    weights = forward.weights
    layers = [getattr(layer, name) for layer in weights.layers for name in ("qkv", "output", "gate_up", "down")]
    layers.append(weights.lm_head)
    total_bytes = total_weights = 0
    for layer in layers:
        total_weights += layer.in_features * layer.out_features
        if isinstance(layer, BlockLinear):
            total_bytes += layer.nbytes
        else:
            total_bytes += layer.in_features * layer.out_features * 2
    return total_bytes, total_weights


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-id", default="smollm2")
    parser.add_argument("--prompt-tokens", type=int, default=190, help="mean prompt of the workload")
    parser.add_argument("--step-rows", type=int, default=16, help="rows of a decode step (requests in flight)")
    args = parser.parse_args(argv)
    bandwidth, rate, int8_rate = read_bandwidth(), float_matrix_rate(), int8_matrix_rate()
    step_bytes, num_weights = packed_bytes(args.model_id)
    limits = {
        "threads": torch.get_num_threads(), "read_bandwidth_gb_s": bandwidth / 1e9,
        "float_matrix_dtype": str(float_matrix_dtype()).removeprefix("torch."),
        "float_matrix_gflop_s": rate / 1e9, "packed_layer_bytes": step_bytes, "layer_weights": num_weights,
        "decode_steps_per_s_at_most": bandwidth / step_bytes,
        "prefill_tokens_per_s_at_most": rate / (2 * num_weights),
        "prompt_prefill_s_at_least": args.prompt_tokens * 2 * num_weights / rate,
        "int8_matrix_gop_s": int8_rate / 1e9,
        "step_of_rows_ms_at_least": 1e3 * max(step_bytes / bandwidth, args.step_rows * 2 * num_weights / int8_rate)}
    print(json.dumps(limits, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
