"""A GGUF file's header read and checked before anything converts or serves it.

`gguf.GGUFReader` maps the whole file and fails deep inside numpy on a truncated one ("cannot
reshape array"), and transformers' loader fails later still on an architecture it does not read.
This reads only the header (metadata and tensor table, not the weights), so a file that cannot be
served is refused at start with the tensor, its type and what is wrong: truncated data, a type id
the gguf library does not know, a shape its own hyperparameters contradict, an architecture
nothing here can load.
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
from collections.abc import Callable, Iterator
from typing import BinaryIO

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class GgufError(ValueError):
    """The GGUF file cannot be served as it is; the message names the file, the tensor and the fault."""


@dataclasses.dataclass(frozen=True)
class GgufTensor:
    """One entry of the tensor table: GGUF lists dimensions innermost first (`[in, out]` for a weight)."""

    name: str
    type_id: int
    dims: tuple[int, ...]
    offset: int  # from the start of the data section

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        try:
            return GGMLQuantizationType(self.type_id).name
        except ValueError:
            return f"type id {self.type_id}"

    def num_bytes(self) -> int:
        """Bytes of its data; GgufError when the gguf library does not know its type."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type_id)]
        except (ValueError, KeyError):
            raise GgufError(f"tensor {self.name!r} has type id {self.type_id}, which this gguf library "
                            "does not know (a newer llama.cpp type?)") from None
        return math.prod(self.dims) // block_size * type_size


@dataclasses.dataclass(frozen=True)
class GgufHeader:
    """What a GGUF file says of itself: its scalar metadata and its tensor table."""

    version: int
    metadata: dict[str, object]
    tensors: list[GgufTensor]
    data_offset: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


def read_gguf_header(path: str) -> GgufHeader:
    """The header of the GGUF file at `path`; GgufError when it is not one or ends inside its header."""
    with open(path, "rb") as file:
        reader = _Reader(file, path)
        if file.read(4) != MAGIC:
            raise GgufError(f"{path} is not a GGUF file (no GGUF magic at its start)")
        version = reader.scalar("<I")
        if version not in (2, 3):
            raise GgufError(f"{path} is GGUF version {version}; versions 2 and 3 are read")
        num_tensors, num_fields = reader.scalar("<Q"), reader.scalar("<Q")
        metadata = dict(reader.fields(num_fields))
        tensors = [reader.tensor() for _ in range(num_tensors)]
        alignment = _int(metadata.get("general.alignment")) or DEFAULT_ALIGNMENT
        data_offset = -(-file.tell() // alignment) * alignment
    return GgufHeader(version, metadata, tensors, data_offset)


def check_gguf(path: str, supported_architectures: Callable[[], list[str]] | None = None) -> GgufHeader:
    """The header, once every tensor's type is known, its data lies inside the file and its shape
    agrees with the hyperparameters; GgufError naming the first tensor that does not."""
    header = read_gguf_header(path)
    if supported_architectures is not None and header.architecture not in (known := supported_architectures()):
        raise GgufError(f"{path}: architecture {header.architecture!r} cannot be served; the GGUF loader "
                        f"reads {', '.join(sorted(known))}")
    file_size = os.path.getsize(path)
    expected = _expected_dims(header)
    for tensor in header.tensors:
        end = header.data_offset + tensor.offset + tensor.num_bytes()
        if end > file_size:
            raise GgufError(f"{path} is truncated: tensor {tensor.name!r} ({tensor.type_name}, dims "
                            f"{list(tensor.dims)}) ends at byte {end}, the file has {file_size}")
        want = expected(tensor.name)
        if want is not None and tensor.dims[: len(want)] != want:
            raise GgufError(f"{path}: tensor {tensor.name!r} ({tensor.type_name}) has dims {list(tensor.dims)}, "
                            f"but the file's own hyperparameters make it {list(want)} (innermost first)")
    return header


def _expected_dims(header: GgufHeader) -> Callable[[str], tuple[int, ...] | None]:
    """The dims a Llama-style tensor must have by the file's `{arch}.*` hyperparameters (None: unchecked)."""
    arch, meta = header.architecture, header.metadata
    embed, heads = _int(meta.get(f"{arch}.embedding_length")), _int(meta.get(f"{arch}.attention.head_count"))
    if not embed or not heads:
        return lambda name: None
    head_dim = _int(meta.get(f"{arch}.attention.key_length")) or embed // heads
    kv_heads = _int(meta.get(f"{arch}.attention.head_count_kv"))
    ffn = _int(meta.get(f"{arch}.feed_forward_length"))
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (embed,), "output.weight": (embed,), "output_norm.weight": (embed,),
        "attn_norm.weight": (embed,), "ffn_norm.weight": (embed,),
        "attn_q.weight": (embed, heads * head_dim), "attn_output.weight": (heads * head_dim, embed)}
    if kv_heads:
        shapes["attn_k.weight"] = shapes["attn_v.weight"] = (embed, kv_heads * head_dim)
    if ffn:
        shapes["ffn_gate.weight"] = shapes["ffn_up.weight"] = (embed, ffn)
        shapes["ffn_down.weight"] = (ffn, embed)

    def expected(name: str) -> tuple[int, ...] | None:
        key = name.split(".", 2)[2] if name.startswith("blk.") and name.count(".") >= 2 else name
        return shapes.get(key)

    return expected


def _int(value: object) -> int | None:
    """A metadata value that is a whole number (bool excluded), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Reader:
    """Little-endian GGUF values from `file`; GgufError when the file ends inside one."""

    def __init__(self, file: BinaryIO, path: str) -> None:
        self.file, self.path = file, path

    def read(self, num_bytes: int) -> bytes:
        data = self.file.read(num_bytes)
        if len(data) != num_bytes:
            raise GgufError(f"{self.path} is truncated: it ends inside its header, at byte {self.file.tell()}")
        return data

    def scalar(self, fmt: str) -> int:
        value: int = struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]
        return value

    def string(self) -> str:
        return self.read(self.scalar("<Q")).decode("utf-8", errors="replace")

    def value(self, value_type: int) -> object:
        """One value: scalars and strings as Python values; an array is skipped (None)."""
        if value_type == STRING:
            return self.string()
        if value_type == ARRAY:
            element_type, count = self.scalar("<I"), self.scalar("<Q")
            if element_type in SCALAR_FORMATS:
                self.read(struct.calcsize(SCALAR_FORMATS[element_type]) * count)
            else:
                for _ in range(count):
                    self.value(element_type)
            return None
        if value_type not in SCALAR_FORMATS:
            raise GgufError(f"{self.path}: a metadata value has type id {value_type}, which GGUF does not define")
        return struct.unpack(SCALAR_FORMATS[value_type], self.read(struct.calcsize(SCALAR_FORMATS[value_type])))[0]

    def fields(self, count: int) -> Iterator[tuple[str, object]]:
        for _ in range(count):
            key = self.string()
            yield key, self.value(self.scalar("<I"))

    def tensor(self) -> GgufTensor:
        name = self.string()
        dims = tuple(self.scalar("<Q") for _ in range(self.scalar("<I")))
        return GgufTensor(name, self.scalar("<I"), dims, self.scalar("<Q"))
