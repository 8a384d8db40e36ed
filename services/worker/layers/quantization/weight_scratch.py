"""`WeightScratch`: one buffer per thread that large-row products de-quantize their weights into.

A prefill chunk of many rows is compute-bound: there the block product is slower than oneDNN's
float product, but a float copy of every layer's weights would cost the memory the codes save.
So a large call de-quantizes its layer into this buffer, multiplies, and the next layer reuses
it: one matrix of the widest layer in memory per thread, not one per layer.
"""

from __future__ import annotations

import threading

import torch


class WeightScratch:
    """`take(shape, dtype)`: a tensor over this thread's buffer, grown as needed; valid until the next take."""

    _local = threading.local()

    @classmethod
    def take(cls, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
        needed = shape[0] * shape[1] * dtype.itemsize
        buffer: torch.Tensor | None = getattr(cls._local, "buffer", None)
        if buffer is None or buffer.numel() < needed:
            buffer = torch.empty(needed, dtype=torch.uint8)
            cls._local.buffer = buffer
        return buffer[:needed].view(dtype).view(shape)

    @classmethod
    def release(cls) -> None:
        """Drop this thread's buffer (its memory back to the allocator)."""
        cls._local.buffer = None
