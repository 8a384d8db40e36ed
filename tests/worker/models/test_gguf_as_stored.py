"""A GGUF served as stored (`--quantize gguf`, what `auto` picks): each block type's layers multiply the
file's own blocks, a type without a product is dequantized, the embedding is read from the file, and
no copy of the weights is written to disk. `--quantize none` from the same file is transformers' model."""

from __future__ import annotations

import logging
import os

import gguf
import numpy as np
import pytest
import torch

from tests.worker.layers.gguf_files import FLOAT16_OFFSETS, random_blocks
from ztgi import LLM, SamplingParams
from ztgi.bench.random_gguf import LlamaShape, write_llama
from ztgi.common.model_source import ModelSource, resolve_model
from ztgi.services.worker.model_loader import load_paged_model
from ztgi.services.worker.models import gguf_module

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


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer Llama GGUF whose tensors are every block type, as `TYPES` lays them out."""
    path = str(tmp_path_factory.mktemp("mixed-gguf") / "mixed.gguf")

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


def test_every_layer_multiplies_the_files_blocks(mixed_gguf, caplog):
    """Each fused layer of the as-stored forward equals its float weights (the file dequantized)
    times the input, to the block products' rounding; Q2_K, which no product takes, is dequantized
    with a log line naming it; the embedding rows are the file's."""
    with caplog.at_level(logging.INFO):
        model = load_paged_model(mixed_gguf, dtype="float32", device="cpu", quantize="gguf")
    assert model.loaded.quantize == "gguf" and model.info().quantize == "gguf"
    assert any("Q2_K" in record.getMessage() and "dequantized" in record.getMessage() for record in caplog.records)
    checkpoint, weights = model.loaded.checkpoint, model.forward_pass.weights
    assert checkpoint is not None
    x = torch.randn(5, SHAPE.hidden_size, generator=torch.Generator().manual_seed(0))
    for index, layer in enumerate(weights.layers):
        prefix = f"model.layers.{index}."
        qkv = torch.cat([checkpoint.float(prefix + f"self_attn.{p}_proj.weight") for p in "qkv"])
        gate_up = torch.cat([checkpoint.float(prefix + f"mlp.{p}_proj.weight") for p in ("gate", "up")])
        for got, weight, inputs in ((layer.qkv(x), qkv, x), (layer.gate_up(x), gate_up, x)):
            expected = inputs @ weight.T
            assert (got - expected).abs().max() <= 1e-3 * expected.abs().max()
    ids = torch.tensor([0, 5, 49151])
    assert torch.equal(weights.embed(ids), checkpoint.float("model.embed_tokens.weight")[ids])


def test_generation_from_every_block_type(mixed_gguf):
    """`LLM` on the file (the default `auto`: as stored) generates; a prompt longer than the block
    products' row limit runs the de-quantized-scratch path; the tokens equal the float model's
    where its margins are wide (random weights: near-ties may part)."""
    as_stored = LLM(mixed_gguf, dtype="bfloat16", device="cpu")
    assert as_stored.model.loaded.quantize == "gguf"
    prompt = "The history of the city begins " * 20
    out = as_stored.generate([prompt, "Hi"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in out] == [8, 8]


def test_none_reads_the_file_as_transformers_does(smollm2, smollm2_reference):
    """`--quantize none` from the embedded GGUF: every weight equals transformers' GGUF loader's."""
    from ztgi.services.worker.models.loading import load

    loaded = load("smollm2", dtype="float32", device="cpu", quantize="none")
    ours = dict(loaded.module.named_parameters())
    for name, parameter in smollm2_reference.named_parameters():
        assert torch.equal(ours[name], parameter), name


def test_no_weights_are_written_to_disk(mixed_gguf, tmp_path, monkeypatch):
    """Resolving a GGUF writes its config and tokenizer, never its weights."""
    monkeypatch.setenv("ZTGI_CACHE_DIR", str(tmp_path))
    source = resolve_model(mixed_gguf)
    files = os.listdir(source.path)
    assert "config.json" in files and "tokenizer.json" in files
    assert not [f for f in files if f.endswith((".safetensors", ".bin", ".pt"))]


@pytest.mark.parametrize("quantize,gguf_file,device,native,expected", [
    ("auto", "m.gguf", "cpu", True, "gguf"),
    ("auto", None, "cpu", True, "none"),
    ("auto", "m.gguf", "cuda", True, "none"),
    ("auto", "m.gguf", "cpu", False, "none"),
    ("none", "m.gguf", "cpu", True, "none"),
    ("int4", "m.gguf", "cpu", True, "int4"),
])
def test_what_auto_means(smollm2_reference, quantize, gguf_file, device, native, expected):
    source = ModelSource("directory", "model", gguf_file)
    assert gguf_module.resolve_quantize(quantize, source, smollm2_reference.config, torch.device(device),
                                        native) == expected


def test_gguf_where_it_cannot_run_is_refused(smollm2_reference):
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_module.resolve_quantize("gguf", ModelSource("directory", "model"), smollm2_reference.config,
                                     torch.device("cpu"), True)
    with pytest.raises(ValueError, match="must be one of"):
        gguf_module.resolve_quantize("int3", ModelSource("directory", "model"), smollm2_reference.config,
                                     torch.device("cpu"), True)
