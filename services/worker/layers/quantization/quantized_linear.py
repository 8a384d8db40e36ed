"""Weight-only quantized linear layers on CPU, kept quantized: int8 per output row, int4 per 32 inputs.

`--quantize int8` stores the decoder blocks' linear weights as int8 with one scale per output row
and multiplies with torch's own `_weight_int8pack_mm`; `--quantize int4` stores them as 4-bit codes
with a scale and an offset per group of 32 inputs (GGUF Q4_1's layout, exactly) and multiplies with
`_weight_int4pack_mm_for_cpu`. In both modes the lm_head is GGUF's Q8_0 (`Int8BlockLinear`: the
file's own blocks where it has them, as llama.cpp computes), where the CPU has AVX512-VNNI or AVX2, and a
float matrix (`PackedLinear`) elsewhere. torch's layers round only the weights; the block products
in C also round their input rows, per block of 32, to about 16 bits (`block_linear`).
torch's two kernels are vectorized for bfloat16 activations and fall back to scalar loops for
float32 (far slower: BENCHMARKS.md); `--dtype auto` is bfloat16 wherever the CPU has bfloat16
instructions (`dtype_choice`).

From a GGUF file whose blocks are Q4_0 or Q4_1, `--quantize int4` takes the 4-bit codes and the
block scales as they are in the file (no de-quantizing and re-quantizing): the layer computes with
the very weights the file holds. Any other tensor is quantized from its float weights. Where the
CPU has AVX512-VNNI (or AVX2) the int4 layers are `block_linear.Int4BlockLinear`, integer products as
llama.cpp computes them (exact integer block sums) with finer activation rows: faster than torch's
int4 kernel at every row count it serves (BENCHMARKS.md).

Quantized kernels pay where a step is memory-bound: a decode step of a few rows reads every weight
once for little arithmetic, so fewer bytes per weight are time saved. A prefill chunk of hundreds
of rows is compute-bound, and there torch's quantized kernels, which widen the weights tile by tile,
are slower than oneDNN's packed float product. So by default a quantized layer keeps a packed float
copy of its weights too and sends steps of more than `quantized_max_rows` rows to it (`RowDispatch`,
as GPU int4 kernels hand large batches to a de-quantized GEMM); `--quantized-max-rows none` keeps
only the quantized weights, for the memory they save.

What each format costs and how far its greedy texts drift from float weights: BENCHMARKS.md
("Quantized weights").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.quantization.block_linear import (
    BlockLinear,
    Int4BlockLinear,
    Int8BlockLinear,
    quantize_blocks,
    runs_natively,
)
from ztgi.services.worker.layers.quantization.options import (
    FALLBACK_QUANTIZED_MAX_ROWS,
    QUANTIZE,
)
from ztgi.services.worker.layers.transformers_module import TransformersModule

logger = logging.getLogger(__name__)

GROUP_SIZE = 32  # inputs per int4 group: GGUF's block size, and the smallest group torch's kernel takes
INT4_MAX = 15
INT8_MAX = 127
HEAD_NAMES = ("lm_head.weight", "model.embed_tokens.weight")  # the output matrix (tied or not)


def check_supported(quantize: str, device: torch.device, dtype: torch.dtype) -> None:
    """ValueError unless `--quantize` can run here: CPU, float32 or bfloat16 activations."""
    if quantize not in QUANTIZE or quantize == "auto":
        raise ValueError(f"--quantize {quantize!r} must be one of {', '.join(QUANTIZE[1:])} here")
    if quantize == "none":
        return
    if device.type != "cpu":
        raise ValueError(f"--quantize {quantize} runs torch's CPU kernels; the device is {device.type}")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"--quantize {quantize} needs float32 or bfloat16 activations, not {dtype}")
    if quantize == "gguf" and not runs_natively():
        logger.warning("--quantize gguf runs torch's block products here, tens of times slower than float "
                       "weights (--quantize auto or none dequantizes the file)")
    elif quantize != "gguf" and dtype == torch.float32 and not runs_natively():
        logger.warning("--quantize %s with float32 activations runs torch's scalar kernels, tens of times "
                       "slower than with --dtype bfloat16", quantize)


class Int8Linear:
    """`y = x @ (codes * scales[:, None]).T`: int8 codes, one scale per output row."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> None:
        self.out_features, self.in_features = codes.shape
        self.codes = codes.to(torch.int8).contiguous()
        self.scales = scales.to(dtype).contiguous()

    @classmethod
    def from_float(cls, weight: torch.Tensor, dtype: torch.dtype) -> Int8Linear:
        """Symmetric per-row rounding, with each scale first rounded to `dtype` (the kernel's), so
        the codes are the nearest to the weights under the scale the kernel really uses."""
        weight = weight.detach().float()
        scales = (weight.abs().amax(dim=1) / INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
        scales = _round_up_to(scales, dtype)
        codes = torch.round(weight / scales[:, None]).clamp(-INT8_MAX, INT8_MAX)
        return cls(codes, scales, dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = torch._weight_int8pack_mm(rows, self.codes, self.scales)
        return y.view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        return self.codes.float() * self.scales.float()[:, None]


@dataclasses.dataclass(frozen=True)
class GroupCodes:
    """4-bit weights by groups of `GROUP_SIZE` inputs: `weight = codes * scales + offsets` per group.

    `codes` `[out, in]` in 0..15, `scales`/`offsets` `[out, in / GROUP_SIZE]` float32.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor

    @staticmethod
    def concat(parts: Sequence[GroupCodes]) -> GroupCodes:
        return GroupCodes(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scales", "offsets")))

    def dequantized(self) -> torch.Tensor:
        out_features, in_features = self.codes.shape
        groups = self.codes.view(out_features, -1, GROUP_SIZE).float()
        return (groups * self.scales[..., None] + self.offsets[..., None]).view(out_features, in_features)

    def permuted_rows(self, order: torch.Tensor) -> GroupCodes:
        return GroupCodes(self.codes[order], self.scales[order], self.offsets[order])


class Int4Linear:
    """`y = x @ W.T` with W as 4-bit codes, a scale and an offset per group of 32 inputs.

    torch's kernel computes `(code - 8) * scale + zero`; with `zero = offset + 8 * scale` that is
    GGUF Q4_1's `code * scale + offset` (Q4_0: `offset = -8 * scale`).
    """

    def __init__(self, groups: GroupCodes, dtype: torch.dtype) -> None:
        self.out_features, self.in_features = groups.codes.shape
        if self.in_features % GROUP_SIZE:
            raise ValueError(f"int4 needs a multiple of {GROUP_SIZE} inputs, not {self.in_features}")
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(groups.codes.to(torch.int32).contiguous(), 1)
        zeros = groups.offsets + 8 * groups.scales
        self.scales_and_zeros = torch.stack([groups.scales, zeros], dim=-1).transpose(0, 1).contiguous().to(dtype)

    @classmethod
    def from_float(cls, weight: torch.Tensor, dtype: torch.dtype) -> Int4Linear:
        return cls(quantize_int4(weight, dtype), dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP_SIZE, self.scales_and_zeros)
        return y.view(*x.shape[:-1], self.out_features)


def quantize_int4(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> GroupCodes:
    """Asymmetric 4-bit rounding per group of 32 inputs (Q4_1's scheme): the group's minimum is the
    offset and its range over 15 the scale, both first rounded to `dtype` (the kernel's)."""
    weight = weight.detach().float()
    out_features, in_features = weight.shape
    if in_features % GROUP_SIZE:
        raise ValueError(f"int4 needs a multiple of {GROUP_SIZE} inputs, not {in_features}")
    groups = weight.view(out_features, -1, GROUP_SIZE)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = _round_up_to(((high - low) / INT4_MAX).clamp(min=torch.finfo(torch.float32).tiny), dtype)
    offsets = low.to(dtype).float()
    codes = torch.round((groups - offsets[..., None]) / scales[..., None]).clamp(0, INT4_MAX)
    return GroupCodes(codes.to(torch.uint8).view(out_features, in_features), scales, offsets)


def _round_up_to(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 `values` rounded to `dtype` and back, never below themselves (no code overflows)."""
    rounded = values.to(dtype).float()
    while bool((smaller := rounded < values).any()):
        bumped = torch.nextafter(rounded.to(dtype), torch.tensor(float("inf"), dtype=dtype)).float()
        rounded = torch.where(smaller, bumped, rounded)
    return rounded


class RowDispatch:
    """The quantized layer for calls of up to `max_rows` rows, the packed float layer above."""

    def __init__(self, quantized: Int8Linear | Int4Linear | Int4BlockLinear | Int8BlockLinear, dense: PackedLinear,
                 max_rows: int) -> None:
        self.quantized, self.dense = quantized, dense
        self.in_features, self.out_features = quantized.in_features, quantized.out_features
        self.max_elements = max_rows * self.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (self.quantized if x.numel() <= self.max_elements else self.dense)(x)


# -- GGUF blocks ------------------------------------------------------------------------------------

GGUF_NAMES = {  # transformers' Llama parameter -> GGUF tensor (blk.N. prefix)
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down"}


class GgufWeights:
    """The 4-bit blocks of a Llama GGUF file, by transformers' parameter names, and its Q8_0 output matrix."""

    def __init__(self, path: str, num_heads: int, num_kv_heads: int, tied: bool) -> None:
        import gguf

        self.path = path
        self.num_heads, self.num_kv_heads, self.tied = num_heads, num_kv_heads, tied
        self._types = gguf.GGMLQuantizationType
        self.tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(path).tensors}

    def gguf_name(self, name: str) -> str | None:
        """`model.layers.3.mlp.up_proj.weight` -> `blk.3.ffn_up.weight`; None for other names."""
        parts = name.split(".")
        if len(parts) != 6 or parts[:2] != ["model", "layers"] or parts[5] != "weight":
            return None
        short = GGUF_NAMES.get(f"{parts[3]}.{parts[4]}")
        return None if short is None else f"blk.{parts[2]}.{short}.weight"

    def group_codes(self, name: str) -> GroupCodes | None:
        """The tensor's 4-bit codes and block scales as stored (Q4_0, Q4_1), in transformers' row
        order; None when the file holds it in another type."""
        gguf_name = self.gguf_name(name)
        tensor = self.tensors.get(gguf_name) if gguf_name else None
        if gguf_name is None or tensor is None or tensor.tensor_type not in (self._types.Q4_0, self._types.Q4_1):
            return None
        in_features, out_features = (int(n) for n in tensor.shape)
        block_bytes = 18 if tensor.tensor_type == self._types.Q4_0 else 20
        blocks = np.asarray(tensor.data).reshape(out_features, in_features // GROUP_SIZE, block_bytes)
        scales = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        if tensor.tensor_type == self._types.Q4_1:
            offsets = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        else:  # Q4_0: code * scale - 8 * scale
            offsets = -8 * scales
        nibbles = blocks[..., block_bytes - GROUP_SIZE // 2:]
        codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(out_features, in_features)
        groups = GroupCodes(torch.from_numpy(codes.copy()), torch.from_numpy(scales), torch.from_numpy(offsets))
        if ".attn_q." in gguf_name:
            return groups.permuted_rows(_unpermute_order(out_features, self.num_heads))
        if ".attn_k." in gguf_name:
            return groups.permuted_rows(_unpermute_order(out_features, self.num_kv_heads))
        return groups

    def output_blocks(self, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The output matrix's int8 codes `[out, in]` and block scales `[out, in / 32]` as stored (Q8_0):
        `output.weight`, or the token embedding where the model ties them; None when the file holds
        it in another type or shape."""
        tensor = self.tensors.get("output.weight") or (self.tensors.get("token_embd.weight") if self.tied else None)
        if tensor is None or tensor.tensor_type != self._types.Q8_0:
            return None
        in_features, out_features = (int(n) for n in tensor.shape)
        if (out_features, in_features) != tuple(shape):
            return None
        blocks = np.asarray(tensor.data).reshape(out_features, in_features // GROUP_SIZE, 2 + GROUP_SIZE)
        scales = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        codes = blocks[..., 2:].copy().view(np.int8).reshape(out_features, in_features)
        return torch.from_numpy(codes), torch.from_numpy(scales)


def _unpermute_order(num_rows: int, num_heads: int) -> torch.Tensor:
    """Row order undoing llama.cpp's q/k permutation (interleaved rotary halves), as transformers'
    GGUF loader does to the float weights."""
    half = num_rows // num_heads // 2
    return torch.arange(num_rows).view(num_heads, half, 2).transpose(1, 2).reshape(num_rows)


# -- the forward's layer factory ---------------------------------------------------------------------

class LinearFactory:
    """Builds the native forward's linear layers from transformers' weights: `factory(w1, w2, ...)`
    is one layer over the weights stacked by rows (fused q/k/v, gate/up).

    `none`: the float weights packed for oneDNN (`PackedLinear`); `int8`: `Int8Linear` for the
    decoder blocks; `int4`: 4-bit blocks for them (the GGUF's own where the file has them), as
    `Int4BlockLinear` (llama.cpp's arithmetic, in C) where its kernel runs here, else torch's
    `Int4Linear`; with `max_rows`, each quantized layer in a `RowDispatch` beside the packed float
    one. The lm_head is `Int8BlockLinear` in both quantized modes (the GGUF's Q8_0 blocks where the
    file has them) where its kernel runs, and `PackedLinear` otherwise.
    """

    def __init__(self, quantize: str = "none", model: TransformersModule | None = None, gguf_file: str | None = None,
                 dtype: torch.dtype = torch.float32, max_rows: int | None = None, native: bool = True,
                 float32_levels: int = 2) -> None:
        self.quantize = quantize
        self.float32_levels = float32_levels  # what the C block products round float32 rows to
        self.native = native  # the GGUF block products in C where they run; False: torch's layers
        self.dtype = dtype
        self.max_rows = max_rows
        self.names: dict[int, str] = {}
        if model is not None:
            self.names = {p.data_ptr(): name for name, p in model.named_parameters(remove_duplicate=False)}
        self.gguf: GgufWeights | None = None
        self.counts: dict[str, int] = {}
        self.limits: dict[str, int] = {}  # the most rows each kind of layer multiplies quantized
        if quantize != "none" and gguf_file and model is not None:
            config = model.config
            self.gguf = GgufWeights(gguf_file, config.num_attention_heads,
                                    config.num_key_value_heads or config.num_attention_heads,
                                    bool(getattr(config, "tie_word_embeddings", False)))

    def __call__(self, *weights: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        weight = weights[0] if len(weights) == 1 else torch.cat(weights)
        names = [self.names.get(w.data_ptr(), "") for w in weights]
        if self.quantize == "none":
            return PackedLinear(weight)
        is_head = any(name in HEAD_NAMES for name in names)
        kind, layer = self._head(weight) if is_head else self._quantized(weight, names)
        if layer is None:
            return PackedLinear(weight)
        if isinstance(layer, BlockLinear):
            layer.float32_levels = self.float32_levels
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.max_rows is None:
            return layer
        # ztgi's 4-bit block products keep up with bfloat16 over more rows than the other kinds
        limit = self.max_rows if isinstance(layer, Int4BlockLinear) else min(self.max_rows, FALLBACK_QUANTIZED_MAX_ROWS)
        self.limits[kind] = limit
        return RowDispatch(layer, PackedLinear(weight), limit)

    def _head(self, weight: torch.Tensor) -> tuple[str, Int8BlockLinear | None]:
        if not self.native:
            return "float lm_head", None
        stored = self.gguf.output_blocks(weight.shape) if self.gguf is not None else None
        codes, scales = stored if stored is not None else quantize_blocks(weight)
        return ("Q8_0 lm_head (GGUF blocks)" if stored is not None else "Q8_0 lm_head",
                Int8BlockLinear.load(codes, scales))

    def _quantized(self, weight: torch.Tensor,
                   names: list[str]) -> tuple[str, Int8Linear | Int4Linear | Int4BlockLinear]:
        if self.quantize == "int8":
            return "int8", Int8Linear.from_float(weight, self.dtype)
        parts = [self.gguf.group_codes(name) for name in names] if self.gguf is not None else []
        stored = [part for part in parts if part is not None]
        from_file = bool(parts) and len(stored) == len(parts)
        kind = "int4 (GGUF blocks)" if from_file else "int4"
        # float16 scales and offsets, as GGUF stores them: what the C product takes
        groups = GroupCodes.concat(stored) if from_file else quantize_int4(weight, torch.float16)
        in_c = Int4BlockLinear.load(groups.codes, groups.scales, groups.offsets) if self.native else None
        if in_c is not None:
            return kind, in_c
        return kind, Int4Linear(groups, self.dtype) if from_file else Int4Linear.from_float(weight, self.dtype)

    def describe(self) -> str:
        kinds = ", ".join(f"{count} {kind}" for kind, count in self.counts.items())
        if not kinds:
            return "float"
        if self.max_rows is None:
            return kinds
        fewer = "".join(f"; {kind} above {limit}" for kind, limit in self.limits.items() if limit != self.max_rows)
        return f"{kinds} (float above {self.max_rows} rows{fewer})"
