"""A linear layer whose weight is laid out once for the CPU's fastest matrix kernel.

On CPU, `torch.nn.functional.linear` in float32 goes to the BLAS sgemm, slower than oneDNN with a
pre-reordered ("packed") weight at a step's row counts (BENCHMARKS.md, "The native forward"). The packed layout is what
torch's own compiler uses for CPU inference (inductor's weight freezing); results differ from the
plain kernel only in summation order. Where oneDNN cannot take the weight (CUDA, float16, a torch
built without it) the layer keeps the plain weight and `F.linear`.

A float32 weight on an x86 CPU with AVX2 stays plain instead: a decode step's few rows
(`DENSE_ROWS_MAX`) go to ztgi's C product (`kernels/csrc/dense_linear_avx2.c`), which reads the weight
at the memory's rate where oneDNN's packed product reads it at about half (BENCHMARKS.md, "Float32
decode rows in C"); more rows (a prefill) go to oneDNN, which takes the plain layout as well. Both sum
in another order than the sgemm, as the packed product always did.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch
import torch.nn.functional as F

from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.kernels.native_library import INT, INT64, POINTER, Kernel

logger = logging.getLogger(__name__)

PACKING_BATCH_HINT = 16  # oneDNN picks its blocking for this many rows; it serves 1 to 512 rows as well
PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
DENSE_ROWS_MAX = 32  # up to this many rows the C product beats oneDNN's; past it oneDNN's blocking wins


class PackedLinear:
    """`y = x @ weight.T`: float32 rows of a decode step by the C product, the rest by oneDNN (the
    weight packed for it where the C product does not run), or plain `F.linear` elsewhere."""

    def __init__(self, weight: torch.Tensor) -> None:
        weight = weight.detach().contiguous()
        self.out_features, self.in_features = weight.shape
        self.dense_rows = DenseRows.load() if DenseRows.takes(weight) else None
        self.onednn = can_pack(weight.device, weight.dtype)
        self.packed = self.onednn and self.dense_rows is None
        self.weight = _pack(weight) if self.packed else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.dense_rows is not None and rows.shape[0] <= DENSE_ROWS_MAX and rows.dtype == torch.float32:
            y = self.dense_rows(rows, self.weight)
        elif self.onednn:
            y = torch.ops.mkldnn._linear_pointwise(rows, self.weight, None, "none", [], "")
        else:
            return F.linear(x, self.weight)
        return y.view(*x.shape[:-1], self.out_features)


class DenseRows:
    """`kernels/csrc/dense_linear_avx2.c`: a few float32 rows by a plain float32 weight."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._product: Kernel = native_library.bind(library, "dense_linear_f32",
                                                    [POINTER, POINTER, INT64, INT64, INT64, POINTER, INT])

    @staticmethod
    def takes(weight: torch.Tensor) -> bool:
        """A float32 CPU weight whose rows come in whole 8-lane vectors."""
        return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.shape[1] % 8 == 0

    @staticmethod
    @functools.cache
    def load() -> DenseRows | None:
        """The built library (once per process), or None where it cannot run (logged, torch's path kept)."""
        library = native_library.load_or_none("dense_linear_avx2.c", "float32 decode rows",
                                               native_library.AVX2_CPU_FLAGS)
        return None if library is None else DenseRows(library)

    def __call__(self, rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows = rows.contiguous()
        y = torch.empty(rows.shape[0], weight.shape[0], dtype=torch.float32)
        status = self._product(rows.data_ptr(), weight.data_ptr(), rows.shape[0], weight.shape[0], weight.shape[1],
                               y.data_ptr(), torch.get_num_threads())
        if status != 0:
            raise RuntimeError(f"dense_linear_f32 refused its inputs (status {status})")
        return y


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
