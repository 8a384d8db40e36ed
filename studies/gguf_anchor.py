"""A GGUF's float anchor, and one file per block type that llama.cpp's own `llama-quantize` makes of it.

The anchor is the source GGUF with every tensor dequantized (gguf-py's `gguf.quants.dequantize`)
and written back as F16 matrices and F32 vectors (norms), its metadata copied, its tensor names
and llama.cpp's row order (Q and K heads as llama.cpp permutes them) kept as they are; so both
servers read the same float weights from it. Each type's file is `llama-quantize anchor TYPE`,
no importance matrix, as a user makes one. Where a tensor's rows do not fit a type's blocks
(SmolLM2's 576 inputs are not a multiple of the K-quants' 256), llama-quantize writes another
type for that tensor: `tensor_types` says what each file holds.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import subprocess

import gguf
import numpy as np

logger = logging.getLogger(__name__)

NOT_COPIED = ("GGUF.", "general.architecture", "general.file_type")  # written by GGUFWriter or here
LLAMA_QUANTIZE_TIMEOUT_S = 1800


def write_float16_anchor(source: str, target: str) -> None:
    """`source`'s metadata and tensors, every tensor dequantized: F16 matrices, F32 vectors."""
    reader = gguf.GGUFReader(source)
    architecture = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(target, architecture)
    for key, field in reader.fields.items():
        if not key.startswith(NOT_COPIED):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, float_tensor(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def float_tensor(tensor: gguf.ReaderTensor) -> np.ndarray:
    """A tensor's values `[rows, columns]` (as the reader maps it): float16 for a matrix, float32 for a vector."""
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return values.astype(np.float16 if values.ndim > 1 else np.float32)


def quantize(llama_quantize: str, anchor: str, target: str, file_type: str, num_threads: int) -> None:
    """`llama-quantize anchor target FILE_TYPE THREADS`; RuntimeError with its output's tail on failure."""
    result = subprocess.run([llama_quantize, anchor, target, file_type, str(num_threads)], capture_output=True,
                            text=True, timeout=LLAMA_QUANTIZE_TIMEOUT_S)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise RuntimeError(f"llama-quantize {file_type} failed (exit {result.returncode}):\n{tail}")


def tensor_types(path: str) -> dict[str, int]:
    """How many tensors of each GGML type a GGUF holds, most first."""
    counts = collections.Counter(tensor.tensor_type.name for tensor in gguf.GGUFReader(path).tensors)
    return dict(counts.most_common())


def file_tag(path: str) -> str:
    """A short tag of a file's path, size and modification time: the anchor is made again when it changes."""
    stat = os.stat(path)
    key = f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}"
    return hashlib.sha256(key.encode()).hexdigest()[:12]


class AnchorFiles:
    """The anchor and the type files of one source GGUF under `directory`, each made once and kept."""

    def __init__(self, source: str, directory: str, llama_quantize: str, num_threads: int) -> None:
        self.source, self.llama_quantize, self.num_threads = source, llama_quantize, num_threads
        name = os.path.basename(source).removesuffix(".gguf")
        self.prefix = os.path.join(directory, f"{name}-{file_tag(source)}")
        os.makedirs(directory, exist_ok=True)

    @property
    def anchor(self) -> str:
        return f"{self.prefix}-F16.gguf"

    def type_file(self, file_type: str) -> str:
        return f"{self.prefix}-{file_type}.gguf"

    def make_anchor(self) -> str:
        """The F16 anchor's path, written (through a temporary file) unless it is there."""
        if not os.path.exists(self.anchor):
            logger.info("writing the float anchor of %s to %s", self.source, self.anchor)
            write_float16_anchor(self.source, self.anchor + ".partial")
            os.replace(self.anchor + ".partial", self.anchor)
        return self.anchor

    def make_type_file(self, file_type: str) -> str:
        """The `file_type` file's path, quantized from the anchor unless it is there."""
        target = self.type_file(file_type)
        if not os.path.exists(target):
            logger.info("llama-quantize %s -> %s", file_type, target)
            quantize(self.llama_quantize, self.make_anchor(), target + ".partial", file_type, self.num_threads)
            os.replace(target + ".partial", target)
        return target
