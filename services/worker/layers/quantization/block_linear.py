"""Linear layers in `BlockCodes`' form (every GGUF block type served as stored), multiplied in C
with integer dot products.

A decode step of a few rows reads every weight once for a few operations each, so its time is the
weights' bytes and how fast the products consume them. torch's CPU int4 kernel widens the 4-bit
weights to bfloat16 and multiplies in float. llama.cpp instead rounds each activation row to int8
per block of 32 inputs and sums each block's products exactly in int32 with the CPU's VNNI dot
products, several times the multiplies per instruction. `kernels/csrc/block_linear.c` does the same
for bfloat16 rows (the serving dtype, whose own mantissa has 8 bits). Rows of float32, the dtype of
exact parity, are rounded finer: what the int8 rounding leaves is rounded again to int8 in steps
254 times finer, so each row keeps about 16 bits per block (with 8-bit rows 28% of greedy requests
kept float weights' text against 52%, BENCHMARKS.md "Quantized weights"; every GGUF type beside
llama.cpp's: "One int8 level for bfloat16 rows" in its history), for a second VNNI product
per block: little where the weights' bytes are the time (one row), but half again the time of a
step of many rows, which the compute decides. One kernel takes 4-, 5-, 6- and 8-bit codes by
sub-blocks of 16 or 32 (`block_layout`).

On a CPU without bfloat16 units float32 is the serving dtype (`--dtype auto` picks it), and its
rows are rounded to one level like bfloat16's (`float32_levels`, `ROWS_FLOAT32_ONE_LEVEL`): there
the second level costs about twice the time of a 16-row step, for precision llama.cpp does not
keep either; `--dtype float32` asked for keeps both (the loader decides, `LoadedModel`).

A call of many rows (a prefill chunk) is compute-bound. Rows of float32 (two levels), and of
bfloat16 where the CPU has AMX, above `LARGE_ROWS[bits]` are multiplied by torch: the layer
de-quantizes its weights into a buffer shared by all layers (`WeightScratch`), without a float copy
of the weights kept in memory, and oneDNN multiplies (with AMX's tiles where there are). bfloat16
rows without AMX, and one-level float32 rows, stay on the integer product at any count: one int8
level beats de-quantizing and torch's product at every count measured (BENCHMARKS.md, issue 39).

- `BlockLinear.load(codes)`: any `BlockCodes`; `load_stacked(parts)`: parts stacked by rows (fused
  q/k/v, gate/up), those of different kinds each in its own codes, all in one kernel call.
- `Int4BlockLinear`, `Int8BlockLinear`: Q4_1/Q4_0 blocks from codes, scales and offsets, and Q8_0
  blocks from int8 codes and scales (`quantize_blocks` rounds float weights to them).

They need a C compiler (`native_library`) and a CPU with AVX512-VNNI and AVX512-BF16, or one with
AVX2, FMA and F16C, where `kernels/csrc/block_linear_avx2.c` computes the same products (the same
rounding of the rows and the same float32 epilogue, its integer sums with `vpmaddubsw` instead of
VNNI); elsewhere `load` returns None and the caller keeps torch's layers (`torch_block_linear`).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import torch

from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.kernels.native_library import INT, INT64, POINTER, Kernel
from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.block_layout import BLOCK_SIZE, BlockLayout
from ztgi.services.worker.layers.quantization.weight_scratch import WeightScratch

INT8_MAX = 127
# `block_linear`'s row formats (`block_weights.h`)
ROWS_FLOAT32, ROWS_BFLOAT16, ROWS_FLOAT32_ONE_LEVEL = 0, 1, 2
CPU_FLAGS = ("avx512f", "avx512bw", "avx512_vnni", "avx512_bf16")
AVX2_FLAGS = native_library.AVX2_CPU_FLAGS  # `block_linear_avx2.c`, where the CPU lacks CPU_FLAGS
# by the codes' bits, the most rows of float32 (and of bfloat16 where the CPU has AMX) the integer
# product takes; more are de-quantized into the scratch and multiplied by torch (measured
# crossovers: the commit that set them)
LARGE_ROWS = {4: 96, 5: 80, 6: 48, 8: 128}
NO_ROW_LIMIT = 1 << 62

__all__ = ["BLOCK_SIZE", "BlockLinear", "Int4BlockLinear", "Int8BlockLinear", "quantize_blocks", "runs_natively"]


class BlockWeights(ctypes.Structure):
    """`kernels/csrc/block_weights.h`'s descriptor."""

    _fields_ = [("bits", ctypes.c_int32), ("sub_block", ctypes.c_int32), ("super_block", ctypes.c_int32),
                ("center", ctypes.c_int32), ("in_features", ctypes.c_int64), ("out_features", ctypes.c_int64),
                ("codes", POINTER), ("planes", POINTER), ("scale_factors", POINTER), ("offset_factors", POINTER),
                ("scale_integers", POINTER), ("offset_integers", POINTER), ("half_factors", ctypes.c_int32),
                ("part_count", ctypes.c_int32), ("parts", POINTER)]

    @classmethod
    def of(cls, layout: BlockLayout) -> BlockWeights:
        """The descriptor of one packed matrix (alive as long as `layout`)."""
        return cls(layout.bits, layout.sub_block, layout.super_block, layout.center, layout.in_features,
                   layout.out_features, _address(layout.codes), _address(layout.planes),
                   _address(layout.scale_factors), _address(layout.offset_factors), _address(layout.scale_integers),
                   _address(layout.offset_integers), layout.scale_factors.dtype == torch.float16, 0, None)


@functools.cache
def _library() -> ctypes.CDLL | None:
    """`block_linear.c` where the CPU has AVX512-VNNI, else its AVX2 twin (the same interface and
    outputs, slower per instruction) where the CPU has AVX2."""
    if set(CPU_FLAGS) <= native_library.cpu_flags() or not set(AVX2_FLAGS) <= native_library.cpu_flags():
        return native_library.load_or_none("block_linear.c", "quantized products", CPU_FLAGS)
    return native_library.load_or_none("block_linear_avx2.c", "quantized products", AVX2_FLAGS)


def runs_natively() -> bool:
    """Whether the C block products run on this CPU (built here, or prebuilt for it); where they
    do not, `BlockLinear` multiplies with torch's ops, tens of times slower."""
    return _kernels() is not None


@functools.cache
def _has_amx() -> bool:
    return "amx_bf16" in native_library.cpu_flags()


@functools.cache
def _kernels() -> tuple[Kernel, Kernel] | None:
    """The product and the de-quantizing, or None (why, logged once) where they cannot run here."""
    library = _library()
    return None if library is None else kernels_of(library)


def kernels_of(library: ctypes.CDLL) -> tuple[Kernel, Kernel]:
    """A block-product library's product and de-quantizing, bound (`BlockLinear`'s `kernels`)."""
    return (native_library.bind(library, "block_linear", [POINTER, INT, INT64, POINTER, POINTER, INT64, INT]),
            native_library.bind(library, "block_dequantize", [POINTER, INT, POINTER, INT]))


def quantize_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0's rounding: per block of 32 inputs a scale of its largest magnitude over 127 (rounded to
    float16, as the file stores it) and int8 codes. Returns codes `[out, in]` and scales `[out, in / 32]`."""
    weight = weight.detach().float()
    out_features, in_features = weight.shape
    blocks = weight.view(out_features, -1, BLOCK_SIZE)
    scales = (blocks.abs().amax(dim=-1) / INT8_MAX).to(torch.float16).float()
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(blocks / safe[..., None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes.view(out_features, in_features), scales


def _address(tensor: torch.Tensor) -> int | None:
    return tensor.data_ptr() if tensor.numel() else None


def _one_input_size(parts: Sequence[BlockCodes]) -> None:
    if len({part.in_features for part in parts}) != 1:
        raise ValueError(f"stacked parts need one input size, not {[part.in_features for part in parts]}")


def _of_one_kind(parts: Sequence[BlockCodes]) -> list[BlockCodes]:
    """Neighbouring parts of the same bits and sub-block stacked into one."""
    runs: list[list[BlockCodes]] = []
    for part in parts:
        if runs and (runs[-1][0].bits, runs[-1][0].sub_block) == (part.bits, part.sub_block):
            runs[-1].append(part)
        else:
            runs.append([part])
    return [run[0] if len(run) == 1 else BlockCodes.concat(run) for run in runs]


class BlockLinear:
    """`y = x @ W.T` by `kernels/csrc/block_linear.c` over this layer's packed `BlockCodes`."""

    @classmethod
    def load(cls, codes: BlockCodes) -> BlockLinear | None:
        """The layer, or None where the kernel cannot run here (logged once) or the inputs are not
        whole blocks of 32."""
        return cls.load_stacked([codes])

    @classmethod
    def load_stacked(cls, parts: Sequence[BlockCodes]) -> BlockLinear | None:
        """Parts stacked by rows (fused q/k/v, gate/up; ValueError unless of one input size), as `load`:
        neighbours of one kind (bits and sub-block) as one matrix, parts of different kinds each packed as
        it is (Q4_K_M's q and k keep 4-bit codes beside a Q6_K v rather than all widened to 6 bits)."""
        _one_input_size(parts)
        kernels = _kernels()
        if kernels is None or parts[0].in_features % BLOCK_SIZE:
            return None
        return cls(_of_one_kind(parts), kernels)

    def __init__(self, codes: BlockCodes | Sequence[BlockCodes], kernels: tuple[Kernel, Kernel]) -> None:
        """`codes`: the matrix, or its parts stacked by rows (one kernel call over all)."""
        parts = [codes] if isinstance(codes, BlockCodes) else list(codes)
        _one_input_size(parts)
        self.layouts = [BlockLayout.pack(part) for part in parts]
        self.out_features, self.in_features = sum(p.out_features for p in parts), parts[0].in_features
        self.bits, self.sub_block = max(p.bits for p in parts), min(p.sub_block for p in parts)
        self._large_rows = min(LARGE_ROWS[p.bits] for p in parts)
        self._large_bf16_rows = self._large_rows if _has_amx() else NO_ROW_LIMIT
        self.float32_levels = 2  # float32 rows' int8 levels (1: as bfloat16's; the loader's choice)
        self._kernel, self._dequantize = kernels
        self.weights = BlockWeights.of(self.layouts[0])
        if len(self.layouts) > 1:
            self._parts = (BlockWeights * len(self.layouts))(*(BlockWeights.of(lay) for lay in self.layouts))
            self.weights = BlockWeights(part_count=len(self.layouts), parts=ctypes.addressof(self._parts),
                                        in_features=self.in_features, out_features=self.out_features)
        self._weights_address = ctypes.addressof(self.weights)

    @property
    def layout(self) -> BlockLayout:
        """The packed matrix of a layer of one part (`layouts` has each part's)."""
        if len(self.layouts) != 1:
            raise ValueError(f"a layer stacked from {len(self.layouts)} parts has one layout each: `layouts`")
        return self.layouts[0]

    @property
    def nbytes(self) -> int:
        """The packed weights' bytes, all that a product reads of them."""
        return sum(layout.nbytes for layout in self.layouts)

    def kernel_address(self) -> int:
        """The product's C function (`BlockLinearFn`), for C code that calls it (`decode_stack`)."""
        return native_library.address(self._kernel)

    def weights_address(self) -> int:
        """This layer's `BlockWeights` descriptor, alive as long as the layer."""
        return self._weights_address

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`x` `[..., in]` bfloat16 or float32 (anything else is taken as float32); the result in its dtype."""
        if x.dtype is torch.bfloat16 and x.dim() == 2 and x.is_contiguous():  # a step's rows: the fast path
            return self._product(x, x.new_empty(x.shape[0], self.out_features))
        bf16 = x.dtype == torch.bfloat16
        rows = x.reshape(-1, self.in_features)
        if not (bf16 or x.dtype == torch.float32) or not rows.is_contiguous():
            rows = rows.to(torch.bfloat16 if bf16 else torch.float32).contiguous()
        out = self._product(rows, rows.new_empty(rows.shape[0], self.out_features))
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def product_into(self, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """`rows @ W.T` written into `out` `[rows, out_features]` of `rows`' dtype, which may be a
        column slice of a wider tensor (unit stride along a row); returns `out`. `rows` contiguous
        `[rows, in]`, bfloat16 or float32."""
        if out.shape != (rows.shape[0], self.out_features) or out.dtype != rows.dtype or rows.dtype not in (
                torch.bfloat16, torch.float32) or (
                self.out_features > 1 and out.stride(1) != 1) or not rows.is_contiguous():
            raise ValueError(f"product_into: rows {list(rows.shape)} {rows.dtype} into out {list(out.shape)} "
                             f"{out.dtype} with strides {out.stride()}")
        return self._product(rows, out)

    def most_rows(self, dtype: torch.dtype) -> int:
        """The most rows of `dtype` one call multiplies with the integer product; more are de-quantized
        and multiplied by torch."""
        one_level = dtype is torch.bfloat16 or self.float32_levels == 1
        return self._large_bf16_rows if one_level else self._large_rows

    def row_format(self, dtype: torch.dtype) -> int:
        """The kernel's `format` for rows of `dtype` (`block_weights.h`): their width and int8 levels."""
        if dtype is torch.bfloat16:
            return ROWS_BFLOAT16
        return ROWS_FLOAT32 if self.float32_levels == 2 else ROWS_FLOAT32_ONE_LEVEL

    def _product(self, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """`product_into` over arguments already checked."""
        if not rows.shape[0]:  # a step with no row to compute (a prefill chunk that needs no logits)
            return out
        if rows.shape[0] > self.most_rows(rows.dtype):
            return torch.mm(rows, self._dequantized_into_scratch(rows.dtype).t(), out=out)
        status = self._kernel(rows.data_ptr(), self.row_format(rows.dtype), rows.shape[0], self._weights_address,
                              out.data_ptr(), out.stride(0), torch.get_num_threads())
        if status != 0:
            raise ValueError(f"block_linear refused its inputs (status {status})")
        return out

    def dequantize(self, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weights as the kernel sees them, `[out, in]` bfloat16 or float32, by the C kernel
        (into `out` where given)."""
        if out is None:
            out = torch.empty(self.out_features, self.in_features, dtype=dtype)
        if out.shape != (self.out_features, self.in_features) or out.dtype != dtype or not out.is_contiguous() or (
                dtype not in (torch.bfloat16, torch.float32)):
            raise ValueError(f"dequantize: {dtype} into {list(out.shape)} {out.dtype}")
        status = self._dequantize(self.weights_address(), dtype == torch.bfloat16, out.data_ptr(),
                                  torch.get_num_threads())
        if status != 0:
            raise ValueError(f"block_dequantize refused its inputs (status {status})")
        return out

    def _dequantized_into_scratch(self, dtype: torch.dtype) -> torch.Tensor:
        return self.dequantize(dtype, WeightScratch.take((self.out_features, self.in_features), dtype))

    def dequantized(self) -> torch.Tensor:
        """The weights as the kernel sees them, `[out, in]` float32, read back from the packed buffers."""
        return torch.cat([layout.unpacked().dequantized() for layout in self.layouts])


class Int4BlockLinear(BlockLinear):
    """Q4_1: 4-bit `codes` `[out, in]` (0..15), `weight = code * scale + offset` with a scale and
    offset per block of 32 inputs (`[out, in / 32]` each; Q4_0's offset is -8 x its scale)."""

    @classmethod
    def load(cls, codes: torch.Tensor, scales: torch.Tensor,  # type: ignore[override]
             offsets: torch.Tensor) -> Int4BlockLinear | None:
        """The layer, or None where the kernel cannot run here."""
        kernels = _kernels()
        if kernels is None:
            return None
        return cls(BlockCodes.plain(codes.to(torch.uint8), 4, BLOCK_SIZE, scales.float(), offsets.float()), kernels)


class Int8BlockLinear(BlockLinear):
    """Q8_0: int8 `codes` `[out, in]` times a scale per block of 32 inputs `scales` `[out, in / 32]`."""

    @classmethod
    def load(cls, codes: torch.Tensor, scales: torch.Tensor) -> Int8BlockLinear | None:  # type: ignore[override]
        """The layer, or None (why, logged) where the kernel cannot run on this machine."""
        kernels = _kernels()
        if kernels is None:
            return None
        unsigned = (codes.to(torch.int16) + 128).to(torch.uint8)  # VNNI takes the weights unsigned
        return cls(BlockCodes.plain(unsigned, 8, BLOCK_SIZE, scales.float(), -128 * scales.float()), kernels)
