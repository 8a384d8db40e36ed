"""A Llama decode step's decoder layers in one C call, where every kernel of them is ztgi's own.

A decode step of a row or two spends more in Python between its kernels than in most of them: a
dozen calls a layer, each a few microseconds of interpreter and bindings. With GGUF block products
(`BlockLinear`, any bits) on a CPU with the C kernels (those, attention in place, the layer steps),
every kernel of a layer is one of ours, so `kernels/csrc/llama_decode_stack.c` runs them all, layer after
layer, through the function pointers of the libraries already built: the same kernels in the same
order as `PagedLlamaForward` calls them, so the step's logits are bit-identical (tested). bfloat16
activations take the AVX512-BF16 kernels, float32 ones their AVX2 kernels (`*_avx2.c`). Steps
with a prefill chunk, more rows than the block layers take, sliding-window or softcapped attention,
or any other layer kind, run call by call as before.
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import torch
import torch.nn.functional as F

from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.layers.attention import AttentionInputs, PagedAttention
from ztgi.services.worker.layers.kv_pool import KVPool
from ztgi.services.worker.layers.layer_ops import NativeLayerOps, TorchLayerOps
from ztgi.services.worker.layers.quantization.block_linear import BlockLinear
from ztgi.services.worker.layers.quantization.quantized_linear import RowDispatch
from ztgi.services.worker.models.llama_weights import LlamaWeights

P = ctypes.c_void_p


class LlamaLayers(Protocol):
    """What the stack reads of the Llama forward it runs the layers of (`PagedLlamaForward`)."""

    weights: LlamaWeights
    attention: PagedAttention
    ops: TorchLayerOps | NativeLayerOps


class _Kernels(ctypes.Structure):
    _fields_ = [("add_rms_norm", P), ("block_linear", P), ("rotary", P), ("attention", P), ("silu_mul", P)]


class _Layer(ctypes.Structure):
    _fields_ = [("attention_norm", P), ("mlp_norm", P), ("qkv", P), ("output", P), ("gate_up", P), ("down", P),
                ("keys", P), ("values", P)]


class _Dims(ctypes.Structure):
    _fields_ = [("num_layers", ctypes.c_int), ("hidden", ctypes.c_int), ("heads", ctypes.c_int),
                ("kv_heads", ctypes.c_int), ("head_dim", ctypes.c_int), ("intermediate", ctypes.c_int),
                ("block_size", ctypes.c_int), ("pool_blocks", ctypes.c_int64), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float), ("row_format", ctypes.c_int)]


class _Step(ctypes.Structure):
    _fields_ = [("rows", ctypes.c_int64), ("cos", P), ("sin", P), ("slots", P), ("tables", P), ("lens", P),
                ("width", ctypes.c_int)]


def _block(layer: object, dtype: torch.dtype) -> tuple[BlockLinear, int] | None:
    """The layer's block product and the most rows of `dtype` it takes it for (above, the layer hands
    them to a float product); None for any other kind."""
    if isinstance(layer, RowDispatch) and isinstance(layer.quantized, BlockLinear):
        return layer.quantized, min(layer.max_elements // layer.in_features, layer.quantized.most_rows(dtype))
    if isinstance(layer, BlockLinear):
        return layer, layer.most_rows(dtype)
    return None


def block_products_only(forward: LlamaLayers, dtype: torch.dtype) -> bool:
    """Whether every product of every layer is a GGUF block product (`BlockLinear`)."""
    return all(_block(getattr(layer, name), dtype) is not None for layer in forward.weights.layers
               for name in ("qkv", "output", "gate_up", "down"))


def _one_table(inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode groups' block tables as one `[rows, width]` (shorter ones padded with block 0,
    never read past a row's length: the kernel takes ragged rows) and their lengths `[rows]`."""
    groups = inputs.decodes
    width = max(group.block_table.shape[1] for group in groups)
    tables = [F.pad(group.block_table, (0, width - group.block_table.shape[1])) for group in groups]
    lens = [group.context_lens for group in groups if group.context_lens is not None]
    assert len(lens) == len(groups), "accepts() checked it"
    table = tables[0] if len(tables) == 1 else torch.cat(tables)
    lengths = lens[0] if len(lens) == 1 else torch.cat(lens)
    return table.to(torch.int64).contiguous(), lengths.to(torch.int64).contiguous()


class NativeDecodeStack:
    """`run` takes a decode-only step's embeddings through every layer; build with `load`."""

    def __init__(self, forward: LlamaLayers, linears: list[list[BlockLinear]], max_rows: int,
                 library: ctypes.CDLL, dtype: torch.dtype = torch.bfloat16) -> None:
        self.forward = forward
        self.dtype = dtype
        self.linears = linears
        self.max_rows = max_rows
        self._run = native_library.bind(library, "llama_decode_stack", [P] * 6 + [P, native_library.INT])
        self._scratch_bytes = library.llama_decode_scratch_bytes
        self._scratch_bytes.argtypes, self._scratch_bytes.restype = [P, ctypes.c_int64], ctypes.c_int64
        ops, attention = forward.ops, forward.attention.native
        assert isinstance(ops, NativeLayerOps) and attention is not None, "load() checked both"
        norm, rotate, silu_mul = ops.addresses()
        self._kernels = _Kernels(norm, linears[0][0].kernel_address(), rotate, attention.decode_address(), silu_mul)
        self._pool: KVPool | None = None
        self._layers: ctypes.Array | None = None
        self._dims: _Dims | None = None
        self._scratch = torch.empty(0, dtype=torch.uint8)

    @classmethod
    def load(cls, forward: LlamaLayers) -> NativeDecodeStack | None:
        """The stack for this forward where all its layers' kernels are ztgi's C ones; else None."""
        attention: PagedAttention = forward.attention
        ops = getattr(forward, "ops", None)
        if not isinstance(ops, NativeLayerOps) or attention.native is None or attention.native.dtype is not ops.dtype:
            return None
        w, dtype = forward.weights, ops.dtype
        norms = [t for layer in w.layers for t in (layer.attention_norm, layer.mlp_norm)]
        if attention.softcap is not None or not all(t.dtype is dtype and t.is_contiguous() for t in norms):
            return None
        # the shapes every kernel takes (the layer-by-layer step falls back to torch per call instead)
        if w.head_dim % 32 or w.head_dim > 256 or w.hidden_size % 16 or w.intermediate_size % 16:
            return None
        found = [[_block(getattr(layer, name), dtype) for name in ("qkv", "output", "gate_up", "down")]
                 for layer in forward.weights.layers]
        if not found or any(kind is None for layer in found for kind in layer):
            return None
        library = native_library.load_or_none("llama_decode_stack.c", "a decode step's layers in one call", ())
        if library is None:
            return None
        max_rows = min(kind[1] for layer in found for kind in layer if kind is not None)
        linears = [[kind[0] for kind in layer if kind is not None] for layer in found]
        return cls(forward, linears, max_rows, library, dtype)

    def accepts(self, x: torch.Tensor, inputs: AttentionInputs) -> bool:
        """Whether this step is one the stack runs: decode rows alone, none windowed, few enough."""
        groups = inputs.decodes
        if inputs.prefills or not groups or x.dtype is not self.dtype or x.shape[0] > self.max_rows:
            return False
        ends = [0, *(group.end for group in groups)]
        return (all(group.start == end and not group.sliding and group.context_lens is not None
                    for group, end in zip(groups, ends, strict=False))
                and ends[-1] == x.shape[0])

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inputs: AttentionInputs,
            pool: KVPool) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream and the last MLP's output `[rows, hidden]` after every layer, from the
        embeddings `x` (consumed); the step's keys and values written to `pool`."""
        dims, layers = self._bound(pool)
        rows = x.shape[0]
        tables, lens = _one_table(inputs)
        slots = inputs.slots.to(torch.int64).contiguous()
        cos, sin = cos.reshape(rows, -1).contiguous(), sin.reshape(rows, -1).contiguous()
        step = _Step(rows, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), tables.data_ptr(), lens.data_ptr(),
                     tables.shape[1])
        needed = self._scratch_bytes(ctypes.byref(dims), rows)
        if self._scratch.numel() < needed:
            self._scratch = torch.empty(needed, dtype=torch.uint8)
        x = x.contiguous()
        residual = torch.empty_like(x)
        status = self._run(ctypes.addressof(self._kernels), ctypes.addressof(dims), ctypes.addressof(layers),
                           ctypes.addressof(step), x.data_ptr(), residual.data_ptr(), self._scratch.data_ptr(),
                           torch.get_num_threads())
        if status != 0:
            raise ValueError(f"llama_decode_stack refused its inputs (status {status}): layer {status // 100}")
        return x, residual

    def _bound(self, pool: KVPool) -> tuple[_Dims, ctypes.Array]:
        """The model's shapes and every layer's weights and pool tensors, as the C code reads them
        (made again when the pool is)."""
        if pool is not self._pool or self._dims is None or self._layers is None:
            self._dims, self._layers = self._describe(pool)
            self._pool = pool
        return self._dims, self._layers

    def _describe(self, pool: KVPool) -> tuple[_Dims, ctypes.Array]:
        w, attention = self.forward.weights, self.forward.attention
        dims = _Dims(len(w.layers), w.hidden_size, w.num_heads, w.num_kv_heads, w.head_dim,
                     w.intermediate_size, pool.block_size, pool.num_blocks, w.eps, attention.scale,
                     self.linears[0][0].row_format(self.dtype))
        layers = (_Layer * len(w.layers))()
        for index, (layer, linears) in enumerate(zip(w.layers, self.linears, strict=True)):
            layers[index] = _Layer(layer.attention_norm.data_ptr(), layer.mlp_norm.data_ptr(),
                                   *(linear.weights_address() for linear in linears),
                                   pool.keys[index].data_ptr(), pool.values[index].data_ptr())
        return dims, layers
