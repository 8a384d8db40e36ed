"""Decode rows' attention on CPU read straight from the KV pool's blocks (`csrc/paged_decode_attention.c`).

torch's path gathers every decode row's blocks into a contiguous buffer, layer by layer, then runs
SDPA over the copy, a kernel slow for the few queries a decode row has. The C kernel reads each
block once where it lies: BENCHMARKS.md ("Decode attention in place") has what it saves. It is
built where the CPU has AVX512-BF16 and a C compiler is found; elsewhere, or with
`--no-native-decode-attention`, torch's path runs. Only bfloat16 pools, without soft-capping or
sliding windows, take it; the rest stay on torch's path.
"""

from __future__ import annotations

import ctypes
import logging
import platform

import torch

from services.worker.paged import native_library

logger = logging.getLogger(__name__)

SOURCE = "paged_decode_attention.c"
REQUIRED_CPU_FLAGS = ("avx512f", "avx512_bf16")


class NativeDecodeAttention:
    """`out[r] = softmax(q[r] . keys[r]^T * scale) . values[r]` over each row's blocks; `load` builds it."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._run = library.paged_decode_attention_bf16
        pointer, integer = ctypes.c_void_p, ctypes.c_int
        self._run.argtypes = [pointer, pointer, pointer, pointer, pointer, integer, integer, integer, integer,
                              integer, integer, ctypes.c_float, pointer, integer]
        self._run.restype = integer

    @classmethod
    def load(cls) -> NativeDecodeAttention | None:
        """The kernel, built for this CPU; None (and why, logged) where it cannot run here."""
        missing = [flag for flag in REQUIRED_CPU_FLAGS if flag not in native_library.cpu_flags()]
        if platform.machine() not in ("x86_64", "AMD64") or missing:
            logger.info("decode attention: torch's (the in-place kernel needs an x86 CPU with %s)",
                        ", ".join(REQUIRED_CPU_FLAGS))
            return None
        try:
            return cls(native_library.load(SOURCE))
        except native_library.BuildError as exc:
            logger.warning("decode attention: torch's, the in-place kernel could not be built: %s", exc)
            return None

    @staticmethod
    def accepts(q: torch.Tensor, pool_keys: torch.Tensor) -> bool:
        """Whether these decode queries and this layer's pool can take the kernel."""
        return (q.device.type == "cpu" and q.dtype == torch.bfloat16 and pool_keys.dtype == torch.bfloat16
                and q.shape[-1] % 32 == 0 and pool_keys.is_contiguous())

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_table: torch.Tensor,
                 context_lens: torch.Tensor, scale: float) -> torch.Tensor:
        """`q` `[rows, heads, head_dim]` over `keys`/`values` `[blocks, block_size, kv_heads, head_dim]`
        through `block_table` `[rows, width]`, `context_lens` `[rows]`; returns `[rows, heads, head_dim]`."""
        q = q.contiguous()
        table, lens = block_table.contiguous(), context_lens.contiguous()
        rows, heads, head_dim = q.shape
        out = torch.empty_like(q)
        status = self._run(q.data_ptr(), keys.data_ptr(), values.data_ptr(), table.data_ptr(), lens.data_ptr(),
                           rows, table.shape[1], heads, keys.shape[2], head_dim, keys.shape[1], scale,
                           out.data_ptr(), torch.get_num_threads())
        if status != 0:
            raise ValueError(f"paged decode attention refused its inputs (status {status}): q {tuple(q.shape)}, "
                             f"table {tuple(table.shape)}, pool {tuple(keys.shape)}")
        return out
