"""`--dtype auto`: the fastest dtype whose greedy texts still equal `transformers`' in that dtype.

On CUDA: bfloat16 where the GPU supports it, else float16 (TGI's choice).

On CPU: bfloat16 where the CPU has bfloat16 matrix instructions (Intel AMX tiles, or AVX-512
`avx512_bf16` as on AMD Zen 4 and 5) and oneDNN takes bfloat16 weights; float32 otherwise (an
AVX2-only CPU has no bfloat16 kernel in oneDNN and would emulate it). vLLM's CPU backend makes the
same call from the instruction set. It is a rule rather than a timing taken at load: on those CPUs
oneDNN's bfloat16 product was never slower than its float32 one (BENCHMARKS.md, "The default dtype
on CPU"), and a timing taken at load on a busy machine could flip the choice, and with it the
greedy texts, from one start of the same server to the next.

The native forward rounds bfloat16 as `transformers` does (its RMSNorm in float32, then cast), so a
bfloat16 default keeps greedy parity with `transformers` in bfloat16 (tests/worker/
test_generate_parity.py). float32 stays one flag away (`--dtype float32`).
"""

from __future__ import annotations

import logging

import torch

from ztgi.services.worker.layers.packed_linear import can_pack

logger = logging.getLogger(__name__)


def auto_dtype(device: torch.device) -> torch.dtype:
    """What `--dtype auto` resolves to on `device`."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and cpu_has_bf16_matrix_units() and can_pack(torch.device("cpu"), torch.bfloat16):
        logger.info("--dtype auto: bfloat16 (the CPU has %s)", "AMX" if _has_amx() else "avx512_bf16")
        return torch.bfloat16
    return torch.float32


def cpu_has_bf16_matrix_units() -> bool:
    """AMX tiles or AVX-512 bfloat16 dot products, as torch sees the CPU."""
    return _has_amx() or bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


def _has_amx() -> bool:
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
