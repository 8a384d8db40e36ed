"""A Llama layer's elementwise steps (residual add with RMSNorm, SiLU gate, rotary), by torch or by C.

`TorchLayerOps` is the arithmetic as torch ops, rounded as transformers rounds it in bfloat16 (the
reference). `NativeLayerOps` does each step in one pass of ztgi's C code on CPU: a decode step of a
few rows spends more in the dozen torch calls per layer these replace than in their arithmetic
(BENCHMARKS.md, "Layer steps in one pass"). For bfloat16 (`kernels/csrc/layer_ops.c`, AVX512-BF16)
it rounds where torch does, so its results are torch's; for float32 (`layer_ops_avx2.c`, AVX2) it
sums in its own order, so the worker takes it only beside GGUF block products (`paged/model.py`).
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.kernels.native_library import FLOAT, INT, INT64, POINTER, Kernel
from ztgi.services.worker.layers.norm import rms_norm
from ztgi.services.worker.layers.rotary import rotate


class TorchLayerOps:
    """The steps as torch ops."""

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """`(rms_norm(x + residual) * weight, x + residual)`; without a residual, `x` itself."""
        summed = x if residual is None else x + residual
        return rms_norm(summed, weight, eps), summed

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """`silu(gate) * up` of `[rows, 2 * width]` rows whose halves are gate and up."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`x` `[tokens, heads, head_dim]` rotated by `cos`/`sin` `[tokens, 1, head_dim]`."""
        return rotate(x, cos, sin)


# each dtype's C source, the CPU flags it needs, its functions' suffix and the lanes a row's width comes in
_SOURCES = {torch.bfloat16: ("layer_ops.c", native_library.REQUIRED_CPU_FLAGS, "bf16", 16),
            torch.float32: ("layer_ops_avx2.c", native_library.AVX2_CPU_FLAGS, "f32", 8)}


class NativeLayerOps:
    """The steps in C for one dtype on CPU (bfloat16 or float32); anything else goes to `TorchLayerOps`."""

    def __init__(self, library: ctypes.CDLL, dtype: torch.dtype = torch.bfloat16) -> None:
        bind, suffix = native_library.bind, _SOURCES[dtype][2]
        self.dtype = dtype
        self._lanes = _SOURCES[dtype][3]
        self._norm = bind(library, f"add_rms_norm_{suffix}", [POINTER, POINTER, POINTER, INT64, INT, FLOAT, POINTER,
                                                              POINTER, INT])
        self._silu_mul = bind(library, f"silu_mul_{suffix}", [POINTER, INT64, INT, POINTER, INT])
        self._rotary = bind(library, f"rotary_{suffix}", [POINTER, INT64, INT, INT, INT64, POINTER, POINTER, POINTER,
                                                          INT])
        self._torch = TorchLayerOps()

    def addresses(self) -> tuple[int, int, int]:
        """The C functions of add_rms_norm, rotate and silu_mul, for C code that calls them (`decode_stack`)."""
        return native_library.address(self._norm), native_library.address(self._rotary), \
            native_library.address(self._silu_mul)

    @classmethod
    def load(cls, dtype: torch.dtype = torch.bfloat16) -> NativeLayerOps | None:
        """The C steps for `dtype` built for this CPU; None (why, logged) where they cannot run here."""
        source, needs = _SOURCES[dtype][:2]
        library = native_library.load_or_none(source, "layer steps", needs)
        return cls(library, dtype) if library is not None else None

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        tensors = (x, weight) if residual is None else (x, residual, weight)
        if not _rows_of(self.dtype, *tensors) or x.shape[-1] % self._lanes:
            return self._torch.add_rms_norm(x, residual, weight, eps)
        normed = torch.empty_like(x)
        summed = x if residual is None else torch.empty_like(x)
        _run(self._norm, x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(),
             x.numel() // x.shape[-1], x.shape[-1], eps, None if residual is None else summed.data_ptr(),
             normed.data_ptr(), torch.get_num_threads())
        return normed, summed

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        width = gate_up.shape[-1] // 2
        if not _rows_of(self.dtype, gate_up) or width % self._lanes:
            return self._torch.silu_mul(gate_up)
        out = gate_up.new_empty(*gate_up.shape[:-1], width)
        _run(self._silu_mul, gate_up.data_ptr(), gate_up.numel() // gate_up.shape[-1], width, out.data_ptr(),
             torch.get_num_threads())
        return out

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        tokens, heads, head_dim = x.shape
        flat_cos, flat_sin = cos.reshape(tokens, head_dim), sin.reshape(tokens, head_dim)
        laid_out = x.stride(2) == 1 and x.stride(1) == head_dim
        if not (laid_out and _rows_of(self.dtype, flat_cos, flat_sin) and x.dtype is self.dtype) or (
                head_dim % (2 * self._lanes)):
            return self._torch.rotate(x, cos, sin)
        out = x.new_empty(tokens, heads, head_dim)
        _run(self._rotary, x.data_ptr(), tokens, heads, head_dim, x.stride(0), flat_cos.data_ptr(),
             flat_sin.data_ptr(), out.data_ptr(), torch.get_num_threads())
        return out


def _rows_of(dtype: torch.dtype, *tensors: torch.Tensor) -> bool:
    for t in tensors:  # a plain loop: this runs several times a layer, at every step
        if t.dtype is not dtype or not t.is_cpu or not t.is_contiguous():
            return False
    return True


def _run(function: Kernel, *args: object) -> None:
    status = function(*args)
    if status != 0:
        raise ValueError(f"{function.__name__} refused its inputs (status {status})")
