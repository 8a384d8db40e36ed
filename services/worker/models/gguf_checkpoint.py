"""A Llama GGUF file's tensors by transformers' parameter names, read where they lie (memory-mapped).

The worker serves a GGUF as stored: the linear weights of every block type `gguf_blocks` covers go
to the C block products as `BlockCodes` (no float copy), the token embedding is read a few rows at
a time (`QuantizedEmbedding`), and only what has no block form (norms, a type no kernel takes) is
dequantized, here, with gguf-py's own dequantizers: the values transformers' GGUF loader computes,
undoing llama.cpp's q/k row permutation as it does, so `--quantize none` keeps parity with it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import mmap

import numpy as np
import torch

from ztgi.common.gguf_header import GgufHeader, GgufTensor, check_gguf
from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.gguf_blocks import block_codes, dequantized_rows
from ztgi.services.worker.layers.transformers_module import TransformersConfig

logger = logging.getLogger(__name__)

ARCHITECTURES = ("llama",)  # whose tensor names and layout `gguf_name` knows
BLOCK_NAMES = {  # transformers' module path inside a decoder block -> GGUF's tensor (blk.N. prefix)
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    """One tensor's bytes in the mapped file, as gguf-py's reader gives them: `[rows, bytes per row]`
    uint8 for block types, float32/float16 values `[rows, columns]` for F32/F16."""

    name: str
    tensor_type: int
    shape: tuple[int, ...]  # numpy order: `[out, in]` for a matrix
    data: np.ndarray

    @property
    def type_name(self) -> str:
        import gguf

        return gguf.GGMLQuantizationType(self.tensor_type).name


class GgufCheckpoint:
    """The tensors of one Llama GGUF file; `config` is transformers' config read from the same file.
    The file is checked (`check_gguf`) and mapped once; nothing is copied until a layer asks."""

    def __init__(self, path: str, config: TransformersConfig) -> None:
        self.path = path
        header = check_gguf(path)
        if header.architecture not in ARCHITECTURES:
            raise ValueError(f"{path}: GGUF architecture {header.architecture!r} is read by transformers' loader, "
                             f"not served as stored (as stored: {', '.join(ARCHITECTURES)})")
        with open(path, "rb") as file:
            self._mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self.tensors = {tensor.name: self._stored(header, tensor) for tensor in header.tensors}
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.tied = bool(getattr(config, "tie_word_embeddings", False)) and "output.weight" not in self.tensors

    def gguf_name(self, name: str) -> str:
        """`model.layers.3.mlp.up_proj.weight` -> `blk.3.ffn_up.weight`; KeyError for a name the file lacks."""
        if name == "lm_head.weight" and self.tied:
            return "token_embd.weight"
        parts = name.split(".")
        if name in TOP_NAMES:
            gguf_name = TOP_NAMES[name]
        elif parts[:2] == ["model", "layers"] and parts[-1] == "weight" and ".".join(parts[3:-1]) in BLOCK_NAMES:
            gguf_name = f"blk.{parts[2]}.{BLOCK_NAMES['.'.join(parts[3:-1])]}.weight"
        else:
            raise KeyError(f"{self.path}: no GGUF tensor for {name!r}")
        if gguf_name not in self.tensors:
            raise KeyError(f"{self.path}: tensor {gguf_name!r} ({name}) is missing")
        return gguf_name

    def _stored(self, header: GgufHeader, tensor: GgufTensor) -> StoredTensor:
        import gguf

        shape = tuple(reversed(tensor.dims))
        start = header.data_offset + tensor.offset
        raw = np.frombuffer(self._mapped, dtype=np.uint8, count=tensor.num_bytes(), offset=start)
        kind = gguf.GGMLQuantizationType(tensor.type_id)
        if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            values = raw.view(np.float32 if kind == gguf.GGMLQuantizationType.F32 else np.float16)
            return StoredTensor(tensor.name, tensor.type_id, shape, values.reshape(shape))
        rows = math.prod(shape[:-1])
        return StoredTensor(tensor.name, tensor.type_id, shape, raw.reshape(rows, -1))

    def release_pages(self) -> None:
        """Drops the mapped file's pages from this process (the layers hold their own packed copies):
        the embedding's rows are read back from the page cache as lookups touch them."""
        self._mapped.madvise(mmap.MADV_DONTNEED)

    def type_name(self, name: str) -> str:
        return self.tensors[self.gguf_name(name)].type_name

    def block_codes(self, name: str) -> BlockCodes | None:
        """The matrix as stored, in transformers' row order; None where its type has no block form."""
        tensor = self.tensors[self.gguf_name(name)]
        out_features, in_features = tensor.shape
        codes = block_codes(tensor.tensor_type, tensor.data, out_features, in_features)
        order = self._row_order(name, out_features)
        return codes if codes is None or order is None else codes.permuted_rows(order)

    def float(self, name: str) -> torch.Tensor:
        """The tensor dequantized to float32, in transformers' layout (q/k rows unpermuted)."""
        import gguf

        tensor = self.tensors[self.gguf_name(name)]
        kind = gguf.GGMLQuantizationType(tensor.tensor_type)
        values = torch.from_numpy(np.array(gguf.quants.dequantize(tensor.data, kind), dtype=np.float32))
        values = values.reshape(tensor.shape)
        order = self._row_order(name, values.shape[0])
        return values if order is None else values[order]

    def embedding_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Rows of the token embedding for `token_ids`, dequantized to float32 `[len(ids), hidden]`."""
        tensor = self.tensors["token_embd.weight"]
        return dequantized_rows(tensor.tensor_type, tensor.data, token_ids)

    def _row_order(self, name: str, num_rows: int) -> torch.Tensor | None:
        """llama.cpp stores q and k with each head's rotary halves interleaved; the order undoing it."""
        if ".self_attn.q_proj." in name:
            return _unpermute_order(num_rows, self.num_heads)
        if ".self_attn.k_proj." in name:
            return _unpermute_order(num_rows, self.num_kv_heads)
        return None


def _unpermute_order(num_rows: int, num_heads: int) -> torch.Tensor:
    half = num_rows // num_heads // 2
    return torch.arange(num_rows).view(num_heads, half, 2).transpose(1, 2).reshape(num_rows)
