"""A GGUF served as stored (`--quantize gguf`, what `auto` picks): each block type's layers multiply the
file's own blocks, a type without a product is dequantized, the embedding is read from the file, and
no copy of the weights is written to disk. `--quantize none` from the same file is transformers' model."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from tests.worker.models.mixed_gguf import SHAPE, write_mixed_gguf
from ztgi import LLM, SamplingParams
from ztgi.common.model_source import ModelSource, resolve_model
from ztgi.services.worker.layers.quantization import block_linear
from ztgi.services.worker.model_loader import load_paged_model
from ztgi.services.worker.models import dtype_choice, gguf_module


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_mixed_gguf(str(tmp_path_factory.mktemp("mixed-gguf") / "mixed.gguf"))


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
    """`LLM` on the file as stored generates (with the C block products where this CPU runs them,
    else torch's); a prompt longer than the block products' row limit runs the de-quantized-scratch
    path; the tokens equal the float model's where its margins are wide (random weights: near-ties
    may part)."""
    as_stored = LLM(mixed_gguf, dtype="bfloat16", device="cpu", quantize="gguf")
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


@pytest.mark.parametrize("quantize,gguf_file,device,native,blocks,expected", [
    ("auto", "m.gguf", "cpu", True, True, "gguf"),
    ("auto", "m.gguf", "cpu", True, False, "none"),  # no C block products on this CPU: float weights
    ("gguf", "m.gguf", "cpu", True, False, "gguf"),  # asked for: torch's block products
    ("auto", None, "cpu", True, True, "none"),
    ("auto", "m.gguf", "cuda", True, True, "none"),
    ("auto", "m.gguf", "cpu", False, True, "none"),
    ("none", "m.gguf", "cpu", True, True, "none"),
    ("int4", "m.gguf", "cpu", True, True, "int4"),
])
def test_what_auto_means(smollm2_reference, quantize, gguf_file, device, native, blocks, expected):
    source = ModelSource("directory", "model", gguf_file)
    assert gguf_module.resolve_quantize(quantize, source, smollm2_reference.config, torch.device(device),
                                        native, lambda: blocks) == expected


def test_auto_dequantizes_where_the_cpu_cannot_run_the_block_products(smollm2_reference, caplog):
    """The log says why the file's weights are dequantized, and the probe is asked only for a GGUF on CPU."""
    asked = []

    def probe() -> bool:
        asked.append(True)
        return False

    with caplog.at_level(logging.INFO):
        assert gguf_module.resolve_quantize("auto", ModelSource("d", "m", "m.gguf"), smollm2_reference.config,
                                            torch.device("cpu"), True, probe) == "none"
    assert any("AVX2, FMA and F16C" in record.getMessage() for record in caplog.records)
    assert gguf_module.resolve_quantize("auto", ModelSource("d", "m"), smollm2_reference.config,
                                        torch.device("cpu"), True, probe) == "none"
    assert len(asked) == 1


def test_gguf_where_it_cannot_run_is_refused(smollm2_reference):
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_module.resolve_quantize("gguf", ModelSource("directory", "model"), smollm2_reference.config,
                                     torch.device("cpu"), True)
    with pytest.raises(ValueError, match="must be one of"):
        gguf_module.resolve_quantize("int3", ModelSource("directory", "model"), smollm2_reference.config,
                                     torch.device("cpu"), True)


@pytest.mark.skipif(not block_linear.runs_natively(), reason="no C block products here (AVX512-VNNI or AVX2)")
@pytest.mark.parametrize("bf16_units,asked,expected", [
    (False, "auto", (torch.float32, 1)), (False, "float32", (torch.float32, 2)), (True, "auto", (torch.bfloat16, 2))])
def test_float32_rows_take_one_level_where_float32_is_only_the_serving_dtype(monkeypatch, bf16_units, asked,
                                                                             expected):
    """`--dtype auto` on a CPU without bfloat16 units serves float32 with its rows rounded to one int8
    level, as bfloat16's (llama.cpp's rounding); `--dtype float32` asked for keeps both levels; on a
    CPU with bfloat16 units auto is bfloat16, whose rows are one level anyway. Every block product of
    the model, in either engine, takes the loader's choice."""
    monkeypatch.setattr(dtype_choice, "cpu_has_bf16_matrix_units", lambda: bf16_units)
    monkeypatch.setattr(dtype_choice, "can_pack", lambda device, dtype: True)
    model = load_paged_model("smollm2", dtype=asked, device="cpu", quantize="auto")
    dtype, levels = expected
    assert (model.dtype, model.loaded.float32_levels) == (dtype, levels)
    products = [getattr(layer, name) for layer in model.forward_pass.weights.layers
                for name in ("qkv", "output", "gate_up", "down")]
    assert products and all(product.float32_levels == levels for product in products)
