"""A Llama-3.2-1B-shaped model with random weights, as the GGUF files people serve: written here as
F16, then quantized by llama.cpp's own `llama-quantize` (Q4_K_M by default). Nothing is downloaded.

    python -m ztgi.bench.random_gguf --llama-quantize /work/llama.cpp-build/bin/llama-quantize \\
        --output /tmp/llama-1b-Q4_K_M.gguf

The shape is Llama 3.2 1B's (16 layers, hidden 2048, intermediate 8192, 32 query heads over 8 KV
heads of 64, tied embeddings, rope base 500000) with SmolLM2's tokenizer and vocabulary of 49152
(the tokenizer and its metadata are copied from the embedded GGUF), so the model has 1.04 billion
weights in its blocks and 0.10 billion in the embedding. The weights are seeded normal draws with
the scale of a trained model's (0.02), norms ones: a model whose greedy texts are arbitrary but
whose every step costs what a real 1B model's costs. `ztgi bench llama-cpp --model-id` serves it on
both sides.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from ztgi.common.model_source import embedded_gguf_path

logger = logging.getLogger(__name__)

LLAMA_FIELDS = ("general.architecture", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")  # not copied
WEIGHT_SCALE = 0.02


@dataclasses.dataclass(frozen=True)
class LlamaShape:
    """The sizes of a Llama; the defaults are Llama 3.2 1B's (with SmolLM2's vocabulary)."""

    num_layers: int = 16
    hidden_size: int = 2048
    intermediate_size: int = 8192
    num_heads: int = 32
    num_kv_heads: int = 8
    context_length: int = 8192
    rope_base: float = 500000.0
    vocab_size: int = 49152  # the embedded tokenizer's

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """GGUF tensor names and numpy shapes (`[out, in]` for matrices), in llama.cpp's order."""
        kv = self.num_kv_heads * self.head_dim
        shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (self.vocab_size, self.hidden_size))]
        for layer in range(self.num_layers):
            shapes += [(f"blk.{layer}.{name}.weight", shape) for name, shape in (
                ("attn_norm", (self.hidden_size,)), ("attn_q", (self.hidden_size, self.hidden_size)),
                ("attn_k", (kv, self.hidden_size)), ("attn_v", (kv, self.hidden_size)),
                ("attn_output", (self.hidden_size, self.hidden_size)), ("ffn_norm", (self.hidden_size,)),
                ("ffn_gate", (self.intermediate_size, self.hidden_size)),
                ("ffn_up", (self.intermediate_size, self.hidden_size)),
                ("ffn_down", (self.hidden_size, self.intermediate_size)))]
        return [*shapes, ("output_norm.weight", (self.hidden_size,))]


Tensor = tuple[int, np.ndarray]  # a GGML type and its data: values, or block bytes `[rows, bytes per row]`


def write_f16(path: str, shape: LlamaShape, seed: int = 0, name: str = "random-llama-1b") -> None:
    """The model as a GGUF of F16 matrices and F32 norms, with the embedded GGUF's tokenizer."""
    import gguf

    generator = np.random.default_rng(seed)

    def tensor(tensor_name: str, tensor_shape: tuple[int, ...]) -> Tensor:
        if len(tensor_shape) == 1:
            return gguf.GGMLQuantizationType.F32, np.ones(tensor_shape, dtype=np.float32)
        values = generator.standard_normal(tensor_shape, dtype=np.float32) * WEIGHT_SCALE
        return gguf.GGMLQuantizationType.F16, values.astype(np.float16)

    write_llama(path, shape, tensor, name)


def write_llama(path: str, shape: LlamaShape, tensor: Callable[[str, tuple[int, ...]], Tensor],
                name: str = "random-llama") -> None:
    """A Llama GGUF of `shape` whose tensors `tensor(name, numpy shape)` gives, with the embedded
    GGUF's tokenizer."""
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_block_count(shape.num_layers)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab_size)
    copy_tokenizer(writer, embedded_gguf_path())
    for tensor_name, tensor_shape in shape.tensors():
        kind, data = tensor(tensor_name, tensor_shape)
        writer.add_tensor(tensor_name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType(kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def copy_tokenizer(writer: object, source: str) -> None:
    """Every `tokenizer.*` field of `source` (vocabulary, merges, special ids, chat template)."""
    import gguf

    assert isinstance(writer, gguf.GGUFWriter)
    for key, field in gguf.GGUFReader(source).fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub_type)


def quantize(llama_quantize: str, source: str, target: str, file_type: str = "Q4_K_M") -> None:
    """llama.cpp's `llama-quantize source target file_type`; CalledProcessError on failure."""
    subprocess.run([llama_quantize, source, target, file_type], check=True, stdout=subprocess.DEVNULL)


def make(llama_quantize: str, output: str, shape: LlamaShape, file_type: str = "Q4_K_M", seed: int = 0) -> str:
    """`output` (kept where it exists: the same seed and shape give the same file), via an F16 file beside it."""
    if os.path.isfile(output):
        return output
    f16 = output + ".f16.gguf"
    started = time.monotonic()
    write_f16(f16, shape, seed)
    logger.info("wrote %s (F16) in %.0f s", f16, time.monotonic() - started)
    try:
        quantize(llama_quantize, f16, output + ".partial", file_type)
        os.rename(output + ".partial", output)
    finally:
        os.remove(f16)
    logger.info("quantized it to %s (%s) in %.0f s total", output, file_type, time.monotonic() - started)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ztgi.bench.random_gguf", description=__doc__.split("\n")[0])
    parser.add_argument("--llama-quantize", required=True, help="path of llama.cpp's llama-quantize binary")
    parser.add_argument("--output", required=True, help="the quantized GGUF to write")
    parser.add_argument("--file-type", default="Q4_K_M", help="llama-quantize's type (Q4_K_M, Q5_K_M, Q8_0, ...)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-layers", type=int, default=LlamaShape.num_layers, help="fewer layers: a smaller model")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    make(args.llama_quantize, args.output, LlamaShape(num_layers=args.num_layers), args.file_type, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
