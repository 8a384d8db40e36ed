"""Host-to-device copies of a step's small index tensors.

On CUDA a copy from pageable memory is synchronous (the driver stages it through a pinned buffer
of its own); from pinned memory it is an asynchronous DMA that overlaps the CPU's work on the
rest of the step's inputs. `pin_memory()` takes its buffers from torch's caching host allocator,
so a pinned copy per tensor costs no new page-locked allocation once the cache is warm.
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (on the host) on `device`: itself on CPU, an asynchronous pinned copy on CUDA."""
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
