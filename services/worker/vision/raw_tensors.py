"""`RawTensor` bytes back into torch tensors: one copy out of the message, never through lists."""

from __future__ import annotations

import torch

from ztgi.common.messages.images import EncodedImage, RawTensor

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


def to_tensor(raw: RawTensor) -> torch.Tensor:
    """The tensor `raw` describes; ValueError naming it where its dtype, shape or size is wrong."""
    dtype = DTYPES.get(raw.dtype)
    if dtype is None:
        raise ValueError(f"tensor {raw.name!r} has dtype {raw.dtype!r}; expected one of {', '.join(DTYPES)}")
    if any(size < 0 for size in raw.shape):
        raise ValueError(f"tensor {raw.name!r} has a negative size in its shape {raw.shape}")
    numel = 1
    for size in raw.shape:
        numel *= size
    expected = numel * torch.empty((), dtype=dtype).element_size()
    if len(raw.data) != expected:
        raise ValueError(f"tensor {raw.name!r} of {raw.dtype} {raw.shape} needs {expected} bytes, "
                         f"got {len(raw.data)}")
    if numel == 0:
        return torch.empty(raw.shape, dtype=dtype)
    # bytearray: torch.frombuffer wants a writable buffer (the copy is the tensor's own memory)
    return torch.frombuffer(bytearray(raw.data), dtype=dtype).view(raw.shape)


def image_tensors(image: EncodedImage) -> dict[str, torch.Tensor]:
    """The image's tensors by name; ValueError for a bad one or a repeated name."""
    tensors: dict[str, torch.Tensor] = {}
    for raw in image.tensors:
        if raw.name in tensors:
            raise ValueError(f"tensor {raw.name!r} is given twice")
        tensors[raw.name] = to_tensor(raw)
    return tensors
