"""Test helpers: raw GGUF blocks of any type with valid float16 factors, real GGUF files of them, and
llama.cpp's own quantizer and de-quantizer where its build is here.

The float16 factors' byte offsets inside each block are written here from llama.cpp's
`ggml-common.h`, apart from the code under test, so random bytes never make a NaN or infinite scale.
gguf-py cannot quantize to the K-quants; llama.cpp's `libggml-base` (the build the llama.cpp
benchmark uses, docs/benchmarks-history.md; another one through `ZTGI_LLAMA_CPP_BUILD`) can.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Mapping

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType

# byte offsets of each block's float16 factors (d, dmin or m) in llama.cpp's block structs
FLOAT16_OFFSETS: dict[Q, tuple[int, ...]] = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.IQ4_XS: (0,),
}

# factors that test the edges: both zeros, the smallest subnormal, the largest float16, negatives
EDGE_FACTORS = np.array([0.0, -0.0, 2.0**-24, -(2.0**-24), 65504.0, -65504.0, 1.0, -0.5], dtype=np.float16)


def random_blocks(kind: Q, out_features: int, in_features: int, seed: int = 0) -> np.ndarray:
    """Random bytes shaped `[out_features, bytes_per_row]` (as `GGUFReader` maps a tensor) whose float16
    factors are finite: mostly small normal values, and the first blocks carry `EDGE_FACTORS`."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    assert in_features % block_size == 0, (kind.name, in_features)
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(out_features * (in_features // block_size), type_size), dtype=np.uint8)
    for offset in FLOAT16_OFFSETS[kind]:
        factors = (rng.standard_normal(len(blocks)) * 0.02).astype(np.float16)
        edges = min(len(EDGE_FACTORS), len(factors))
        factors[:edges] = rng.permutation(EDGE_FACTORS)[:edges]
        blocks[:, offset:offset + 2] = factors.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(out_features, -1)


def write_gguf(path: str, tensors: Mapping[str, tuple[Q, np.ndarray]], architecture: str = "llama") -> None:
    """A real GGUF file holding each tensor as given: `(type, data)` with `data` the raw block bytes
    `[out, bytes_per_row]` uint8 for a quantized type, or a float32/float16 `[out, in]` array."""
    writer = gguf.GGUFWriter(path, architecture)
    for name, (kind, data) in tensors.items():
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_each_type(path: str, kinds: list[Q], out_features: int = 8, in_features: int = 512,
                    seed: int = 0) -> dict[str, tuple[Q, np.ndarray]]:
    """A GGUF file with one `random_blocks` tensor per type, named `<type>.weight` in lower case
    (`q4_k.weight`); returns what it wrote, by name."""
    tensors = {f"{kind.name.lower()}.weight": (kind, random_blocks(kind, out_features, in_features, seed + number))
               for number, kind in enumerate(kinds)}
    write_gguf(path, tensors)
    return tensors


LLAMA_CPP_BUILD = os.environ.get("ZTGI_LLAMA_CPP_BUILD", "/work/llama.cpp-build")


@functools.cache
def llama_cpp_library() -> ctypes.CDLL | None:
    """llama.cpp's `libggml-base.so` from `LLAMA_CPP_BUILD`, or None where it is not built."""
    path = os.path.join(LLAMA_CPP_BUILD, "bin", "libggml-base.so")
    if not os.path.exists(path):
        return None
    library = ctypes.CDLL(path)
    library.ggml_quantize_chunk.restype = ctypes.c_size_t
    library.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return library


def llama_cpp_quantize(kind: Q, weights: np.ndarray) -> np.ndarray:
    """float32 `[out, in]` weights quantized by llama.cpp (`ggml_quantize_chunk`, no importance matrix):
    the block bytes `[out, bytes_per_row]` its tools write into a file."""
    library = llama_cpp_library()
    assert library is not None, f"no llama.cpp build at {LLAMA_CPP_BUILD}"
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    out_features, in_features = weights.shape
    blocks = np.zeros(gguf.quant_shape_to_byte_shape(weights.shape, kind), dtype=np.uint8)
    written = library.ggml_quantize_chunk(int(kind), weights.ctypes.data, blocks.ctypes.data, 0, out_features,
                                          in_features, None)
    assert written == blocks.nbytes, (kind.name, written, blocks.nbytes)
    return blocks


def llama_cpp_dequantize(kind: Q, blocks: np.ndarray) -> np.ndarray:
    """llama.cpp's own `dequantize_row_<type>` of block bytes `[out, bytes_per_row]`: float32 `[out, in]`."""
    library = llama_cpp_library()
    assert library is not None, f"no llama.cpp build at {LLAMA_CPP_BUILD}"
    blocks = np.ascontiguousarray(blocks)
    weights = np.zeros(gguf.quant_shape_from_byte_shape(blocks.shape, kind), dtype=np.float32)
    dequantize_row = getattr(library, f"dequantize_row_{kind.name.lower().replace('_k', '_K')}")
    dequantize_row.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    dequantize_row(blocks.ctypes.data, weights.ctypes.data, weights.size)
    return weights
