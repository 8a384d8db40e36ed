"""A 2-layer Llama GGUF whose tensors are every block type ztgi multiplies as stored, a fused layer of
mixed types, and one type it does not (Q2_K): what the as-stored tests and the shard tests serve."""

from __future__ import annotations

import gguf
import numpy as np

from tests.worker.layers.gguf_files import FLOAT16_OFFSETS, random_blocks
from ztgi.bench.random_gguf import LlamaShape, write_llama

Q = gguf.GGMLQuantizationType
SHAPE = LlamaShape(num_layers=2, hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2,
                   context_length=1024)
TYPES = {  # layer 0, layer 1: every covered type, a fused layer of mixed types, and Q2_K (not covered)
    "attn_q": (Q.Q4_K, Q.Q4_0), "attn_k": (Q.Q4_K, Q.Q4_1), "attn_v": (Q.Q6_K, Q.Q5_0),
    "attn_output": (Q.Q5_K, Q.Q5_1), "ffn_gate": (Q.Q4_0, Q.Q4_K), "ffn_up": (Q.Q8_0, Q.Q2_K),
    "ffn_down": (Q.Q5_0, Q.Q6_K)}
EMBEDDING_TYPE = Q.Q6_K  # tied: the lm_head too
# each type's factors sized so that its weights are about 0.02 (a trained model's scale)
FACTORS = {Q.Q4_0: 0.005, Q.Q4_1: 0.005, Q.Q5_0: 0.002, Q.Q5_1: 0.002, Q.Q8_0: 0.0003, Q.Q4_K: 1e-4,
           Q.Q5_K: 5e-5, Q.Q6_K: 2e-5, Q.Q2_K: 3e-4}


def _blocks(kind: Q, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """`random_blocks` with every float16 factor a small positive value of the type's scale."""
    blocks = random_blocks(kind, shape[0], shape[1], seed)
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    flat = blocks.reshape(-1, type_size)
    rng = np.random.default_rng(seed)
    for offset in FLOAT16_OFFSETS[kind]:
        factors = (FACTORS[kind] * (0.5 + rng.random(len(flat)))).astype(np.float16)
        flat[:, offset:offset + 2] = factors.view(np.uint8).reshape(-1, 2)
    return blocks


def write_mixed_gguf(path: str) -> str:
    """The file at `path`, its tensors' types as `TYPES` lays them out."""

    def tensor(name: str, shape: tuple[int, ...]) -> tuple[int, np.ndarray]:
        if len(shape) == 1:
            return Q.F32, np.ones(shape, dtype=np.float32)
        if name == "token_embd.weight":
            return EMBEDDING_TYPE, _blocks(EMBEDDING_TYPE, shape, seed=99)
        layer, kind = int(name.split(".")[1]), name.split(".")[2]
        block_type = TYPES[kind][layer]
        return block_type, _blocks(block_type, shape, seed=layer * 10 + list(TYPES).index(kind))

    write_llama(path, SHAPE, tensor)
    return path
