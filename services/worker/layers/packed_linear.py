"""A linear layer whose weight is laid out once for the CPU's fastest matrix kernel.

On CPU, `torch.nn.functional.linear` in float32 goes to the BLAS sgemm, slower than oneDNN with a
pre-reordered ("packed") weight at a step's row counts (BENCHMARKS.md, "The native forward"). The packed layout is what
torch's own compiler uses for CPU inference (inductor's weight freezing); results differ from the
plain kernel only in summation order. Where oneDNN cannot take the weight (CUDA, float16, a torch
built without it) the layer keeps the plain weight and `F.linear`.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

PACKING_BATCH_HINT = 16  # oneDNN picks its blocking for this many rows; it serves 1 to 512 rows as well
PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


class PackedLinear:
    """`y = x @ weight.T` with the weight packed for oneDNN on CPU, or plain elsewhere."""

    def __init__(self, weight: torch.Tensor) -> None:
        weight = weight.detach().contiguous()
        self.out_features, self.in_features = weight.shape
        self.packed = can_pack(weight.device, weight.dtype)
        self.weight = _pack(weight) if self.packed else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.packed:
            return F.linear(x, self.weight)
        rows = x.reshape(-1, self.in_features)
        y = torch.ops.mkldnn._linear_pointwise(rows, self.weight, None, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACKING_BATCH_HINT)


@functools.cache
def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN takes weights of this device and dtype, checked once against `F.linear`."""
    if device.type != "cpu" or dtype not in PACKABLE_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 32, generator=generator).to(dtype)
    x = torch.randn(5, 32, generator=generator).to(dtype)
    try:
        packed = torch.ops.mkldnn._linear_pointwise(x, _pack(weight), None, "none", [], "")
    except (RuntimeError, AttributeError) as exc:
        logger.warning("oneDNN packed weights unavailable (%s): plain F.linear", exc)
        return False
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    return torch.allclose(packed.float(), F.linear(x, weight).float(), rtol=tolerance, atol=tolerance)
