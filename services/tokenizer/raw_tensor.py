"""Image processor outputs as the wire carries them: raw little-endian bytes, never lists, and
the digest the prefix cache keys an image's blocks with."""

from __future__ import annotations

import hashlib

import numpy as np

from ztgi.common.messages import RawTensor

DTYPES = {np.dtype(np.float32): "float32", np.dtype(np.int64): "int64", np.dtype(np.bool_): "bool"}


def raw_tensor(name: str, array: np.ndarray) -> RawTensor:
    """`array` in C order, little-endian, named by torch's name for its dtype."""
    dtype = DTYPES.get(array.dtype)
    assert dtype is not None, f"image processors give float32, int64 or bool arrays, not {array.dtype}"
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return RawTensor(name, dtype, list(array.shape), data)


def tensors_digest(tensors: list[RawTensor]) -> bytes:
    """16 bytes of blake2b over every tensor's name, dtype, shape and data: equal for the same
    pixels processed the same way, different for anything else."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in tensors:
        header = f"{tensor.name}\0{tensor.dtype}\0{','.join(map(str, tensor.shape))}\0{len(tensor.data)}\0"
        digest.update(header.encode())
        digest.update(tensor.data)
    return digest.digest()
