"""Attention on CPU read straight from the KV pool's blocks: ztgi's C kernels (`csrc/`).

torch's path gathers every decode row's blocks into a contiguous buffer, layer by layer, then runs
SDPA over the copy, a kernel slow for the few queries a decode row has; a prefill chunk with
cached keys is gathered the same way, and torch's CPU flash kernel for bfloat16 runs well below
the machine's bfloat16 dot-product rate. The kernels read each block where it lies and multiply
with AVX512-BF16 (`paged_decode_attention.c`, `paged_prefill_attention.c`; BENCHMARKS.md, "Attention
in place"). They are built where the CPU has AVX512-BF16 and a C compiler is found
(`native_library.py`); elsewhere, or with `--no-native-kernels`, torch's path runs. Only bfloat16
pools without soft-capping or sliding windows take them; the rest stay on torch's path. Float32
pools have a decode kernel with AVX2 (`paged_decode_attention_avx2.c`), taken beside GGUF block
products only (`paged/model.py`: it sums in another order than torch); their prefill stays torch's.
"""

from __future__ import annotations

import ctypes

import torch

from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.kernels.native_library import FLOAT, INT, INT64, POINTER


class NativeAttention:
    """The decode and (bfloat16) prefill kernels of one dtype's build; `load` builds them."""

    def __init__(self, decode_library: ctypes.CDLL, prefill_library: ctypes.CDLL | None,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        self.dtype = dtype
        self._lanes = 32 if dtype is torch.bfloat16 else 8  # head_dim a multiple of this
        self._decode = native_library.bind(decode_library, f"paged_decode_attention_{_SUFFIX[dtype]}", [
            POINTER, POINTER, POINTER, INT64, POINTER, POINTER, INT, INT, INT, INT, INT, INT, FLOAT, POINTER, INT])
        self._prefill = None if prefill_library is None else native_library.bind(
            prefill_library, "paged_prefill_attention_bf16", [
                POINTER, POINTER, POINTER, INT64, POINTER, INT64, INT64, INT64, INT, INT, INT, INT, FLOAT, POINTER,
                INT])

    @classmethod
    def load(cls, dtype: torch.dtype = torch.bfloat16) -> NativeAttention | None:
        """The kernels for `dtype` pools, built for this CPU; None (and why, logged) where they cannot run here."""
        if dtype is torch.float32:
            decode = native_library.load_or_none("paged_decode_attention_avx2.c", "decode attention",
                                                 native_library.AVX2_CPU_FLAGS)
            return cls(decode, None, dtype) if decode is not None else None
        decode = native_library.load_or_none("paged_decode_attention.c", "attention")
        prefill = native_library.load_or_none("paged_prefill_attention.c", "attention") if decode else None
        return cls(decode, prefill) if decode is not None and prefill is not None else None

    @property
    def reads_prefill(self) -> bool:
        """Whether prefill chunks take a kernel too (bfloat16); float32 ones stay torch's."""
        return self._prefill is not None

    def decode_address(self) -> int:
        """The decode kernel's C function, for C code that calls it (`decode_stack`)."""
        return native_library.address(self._decode)

    def accepts(self, q: torch.Tensor, pool_keys: torch.Tensor, prefill: bool = False) -> bool:
        """Whether these queries and this layer's pool can take the kernels (`prefill`: a chunk's)."""
        return ((not prefill or self._prefill is not None) and q.device.type == "cpu" and q.dtype is self.dtype
                and pool_keys.dtype is self.dtype and q.shape[-1] % self._lanes == 0 and q.shape[-1] <= 256
                and pool_keys.is_contiguous())

    def decode(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_table: torch.Tensor,
               context_lens: torch.Tensor, scale: float) -> torch.Tensor:
        """Each row's one query `q` `[rows, heads, head_dim]` over its `context_lens` keys in `keys`/`values`
        `[blocks, block_size, kv_heads, head_dim]` through `block_table` `[rows, width]`."""
        q, table, lens = q.contiguous(), _int64(block_table), _int64(context_lens)
        rows, heads, head_dim = q.shape
        out = torch.empty_like(q)
        status = self._decode(q.data_ptr(), keys.data_ptr(), values.data_ptr(), keys.shape[0], table.data_ptr(),
                              lens.data_ptr(), rows, table.shape[1], heads, keys.shape[2], head_dim, keys.shape[1],
                              scale, out.data_ptr(), torch.get_num_threads())
        _check(status, "decode", q, table, keys)
        return out

    def prefill(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_table: torch.Tensor,
                cache_len: int, scale: float) -> torch.Tensor:
        """A chunk's queries `q` `[n, heads, head_dim]`, at positions `cache_len ..`, each over the keys up
        to its own position through the request's `block_table` `[blocks]` (the chunk's keys written)."""
        assert self._prefill is not None, "accepts(prefill=True) checked it"
        q, table = q.contiguous(), _int64(block_table)
        n, heads, head_dim = q.shape
        out = torch.empty_like(q)
        status = self._prefill(q.data_ptr(), keys.data_ptr(), values.data_ptr(), keys.shape[0], table.data_ptr(),
                               table.numel(), n, cache_len, heads, keys.shape[2], head_dim, keys.shape[1], scale,
                               out.data_ptr(), torch.get_num_threads())
        _check(status, "prefill", q, table, keys)
        return out


_SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32"}


def _int64(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype == torch.int64 and tensor.is_contiguous():  # as the step's inputs are: no call
        return tensor
    return tensor.to(torch.int64).contiguous()


def _check(status: int, kernel: str, q: torch.Tensor, table: torch.Tensor, keys: torch.Tensor) -> None:
    if status != 0:
        raise ValueError(f"the {kernel} attention kernel refused its inputs (status {status}): q {tuple(q.shape)}, "
                         f"table {tuple(table.shape)}, pool {tuple(keys.shape)}")
