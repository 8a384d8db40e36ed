"""Quantized weights kept quantized: int8 and int4 layers, GGUF 4-bit blocks taken as stored, --quantize."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.worker.engine_helpers import batch_of, request, run_to_end, token_ids
from ztgi.common.config import ConfigError, parse_config
from ztgi.services.launcher.config import LaunchConfig
from ztgi.services.worker.config import DEFAULT_QUANTIZED_MAX_ROWS, WorkerConfig
from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.quantization.block_linear import (
    BLOCK_SIZE,
    BlockLinear,
    Int4BlockLinear,
    Int8BlockLinear,
    quantize_blocks,
)
from ztgi.services.worker.layers.quantization.options import FALLBACK_QUANTIZED_MAX_ROWS
from ztgi.services.worker.layers.quantization.quantized_linear import (
    GROUP_SIZE,
    GgufWeights,
    GroupCodes,
    Int4Linear,
    Int8Linear,
    LinearFactory,
    RowDispatch,
    _unpermute_order,
    quantize_int4,
)
from ztgi.services.worker.model_loader import load_model

ACTIVATION_DTYPES = [torch.float32, torch.bfloat16]


def _weight(out_features: int = 96, in_features: int = 128, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=generator) * in_features ** -0.5


@pytest.mark.parametrize("dtype", ACTIVATION_DTYPES)
def test_int8_layer_computes_with_its_own_rounded_weights(dtype: torch.dtype):
    """The int8 layer equals F.linear over its de-quantized weights (kernel rounding aside), whose
    error is at most half a step of each row's scale, and works on 2-d and 3-d inputs."""
    weight = _weight()
    layer = Int8Linear.from_float(weight, dtype)
    assert layer.codes.dtype == torch.int8 and layer.scales.dtype == dtype
    steps = layer.scales.float()[:, None]
    assert bool(((layer.dequantized() - weight).abs() <= steps / 2 + 1e-7).all())
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    for shape in ((1, 128), (16, 128), (2, 5, 128)):
        x = torch.randn(shape).to(dtype)
        expected = F.linear(x.float(), layer.dequantized())
        torch.testing.assert_close(layer(x).float(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", ACTIVATION_DTYPES)
def test_int4_layer_computes_with_its_groups(dtype: torch.dtype):
    """The int4 layer equals F.linear over codes x scale + offset per 32 inputs, each within half
    a step of the float weight."""
    weight = _weight()
    groups = quantize_int4(weight, dtype)
    assert groups.codes.shape == weight.shape and groups.scales.shape == (96, 128 // GROUP_SIZE)
    assert int(groups.codes.max()) <= 15
    steps = groups.scales.repeat_interleave(GROUP_SIZE, dim=1)
    assert bool(((groups.dequantized() - weight).abs() <= steps / 2 + 1e-6).all())
    layer = Int4Linear(groups, dtype)
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    for shape in ((1, 128), (16, 128), (2, 5, 128)):
        x = torch.randn(shape).to(dtype)
        expected = F.linear(x.float(), groups.dequantized())
        torch.testing.assert_close(layer(x).float(), expected, rtol=tolerance, atol=tolerance)


def test_int4_needs_whole_groups():
    with pytest.raises(ValueError, match="multiple of 32"):
        Int4Linear.from_float(_weight(in_features=48), torch.float32)


def _write_gguf(path: str, tensors: dict[str, tuple[np.ndarray, object]]) -> None:
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    for name, (weight, kind) in tensors.items():
        blocks = gguf.quants.quantize(weight, kind)
        writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_q4_blocks_are_taken_as_stored(tmp_path):
    """Q4_0 and Q4_1 blocks read into codes and scales that de-quantize to exactly what gguf-py's
    own de-quantizer gives; q and k rows come back in transformers' order; a Q8_0 tensor is not
    4-bit (None: it is quantized from float instead)."""
    import gguf

    kinds = gguf.GGMLQuantizationType
    rng = np.random.RandomState(0)
    weights = {name: rng.randn(16, 64).astype(np.float32) for name in ("down", "q", "k", "up")}
    path = str(tmp_path / "tiny.gguf")
    _write_gguf(path, {"blk.0.ffn_down.weight": (weights["down"], kinds.Q4_0),
                       "blk.0.attn_q.weight": (weights["q"], kinds.Q4_1),
                       "blk.0.attn_k.weight": (weights["k"], kinds.Q4_1),
                       "blk.0.ffn_up.weight": (weights["up"], kinds.Q8_0)})
    source = GgufWeights(path, num_heads=4, num_kv_heads=2, tied=True)

    def reference(name: str, kind) -> torch.Tensor:
        return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(weights[name], kind), kind))

    down = source.group_codes("model.layers.0.mlp.down_proj.weight")
    assert torch.equal(down.dequantized(), reference("down", kinds.Q4_0))
    q = source.group_codes("model.layers.0.self_attn.q_proj.weight")
    assert torch.equal(q.dequantized(), reference("q", kinds.Q4_1)[_unpermute_order(16, 4)])
    k = source.group_codes("model.layers.0.self_attn.k_proj.weight")
    assert torch.equal(k.dequantized(), reference("k", kinds.Q4_1)[_unpermute_order(16, 2)])
    assert source.group_codes("model.layers.0.mlp.up_proj.weight") is None
    assert source.group_codes("model.layers.1.mlp.up_proj.weight") is None
    assert source.group_codes("lm_head.weight") is None


def test_unpermute_order_is_transformers_reverse_permutation():
    """The row order undoes llama.cpp's permutation as transformers' GGUF loader does it."""
    rows, heads = 24, 3
    weights = torch.arange(rows * 2).view(rows, 2)
    half = rows // heads // 2
    expected = weights.reshape(heads, half, 2, 2).swapaxes(2, 1).reshape(rows, 2)
    assert torch.equal(weights[_unpermute_order(rows, heads)], expected)


def test_embedded_gguf_blocks_equal_the_converted_float_weights(smollm2, smollm2_reference):
    """Every 4-bit tensor of the embedded SmolLM2 GGUF, read as codes and block scales, equals the
    float weight transformers de-quantized from it, bit for bit (q/k permutation included)."""
    config = smollm2_reference.config
    source = GgufWeights(smollm2.gguf_file, config.num_attention_heads, config.num_key_value_heads, tied=True)
    checked = 0
    for name, parameter in smollm2_reference.named_parameters():
        groups = source.group_codes(name)
        if groups is not None:
            assert torch.equal(groups.dequantized(), parameter.detach()), name
            checked += 1
    assert checked == 7 * config.num_hidden_layers


def test_factory_quantizes_the_blocks_and_the_lm_head(tiny_reference):
    """int8/int4 for the decoder blocks' weights (stacked by rows; int4 as GGUF block products where
    the C kernels run) and Q8_0 for the lm_head (tied to the embedding here) there too;
    PackedLinear for everything with --quantize none."""
    attention = tiny_reference.model.layers[0].self_attn
    qkv = (attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight)
    in_c = Int8BlockLinear.load(*quantize_blocks(torch.ones(16, 32))) is not None
    head_kind = Int8BlockLinear if in_c else PackedLinear
    int4_kind = Int4BlockLinear if in_c else Int4Linear
    for quantize, kind in (("none", PackedLinear), ("int8", Int8Linear), ("int4", int4_kind)):
        factory = LinearFactory(quantize, tiny_reference, None, torch.float32)
        layer = factory(*qkv)
        assert isinstance(layer, kind) and layer.out_features == sum(w.shape[0] for w in qkv)
        assert isinstance(factory(tiny_reference.lm_head.weight), head_kind if quantize != "none" else PackedLinear)
    assert LinearFactory("int4", tiny_reference).describe() == "float"
    torch_only = LinearFactory("int4", tiny_reference, None, torch.float32, native=False)  # --no-native-kernels
    assert isinstance(torch_only(*qkv), Int4Linear)
    assert isinstance(torch_only(tiny_reference.lm_head.weight), PackedLinear)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_quantized_model_equals_transformers_with_the_same_rounded_weights(tiny_model_dir, quantize):
    """The native forward with quantized blocks gives the logits transformers gives when its
    weights are replaced by the layers' own de-quantized ones: float32 activations, exact but for
    summation order with torch's kernels; where the layers are GGUF block products, which round
    their input rows to int8 per block as llama.cpp does, within what that rounding moves (the
    products themselves are checked exactly in test_block_linear.py). And it generates."""
    from transformers import AutoModelForCausalLM

    model = load_model(tiny_model_dir, dtype="float32", device="cpu", kv_cache="padded", quantize=quantize)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    rounds_inputs = False
    for block, layer in zip(reference.model.layers, model.forward_pass.layers, strict=True):
        attention, mlp = block.self_attn, block.mlp
        for linears, fused in (((attention.q_proj, attention.k_proj, attention.v_proj), layer.qkv),
                               ((attention.o_proj,), layer.output), ((mlp.gate_proj, mlp.up_proj), layer.gate_up),
                               ((mlp.down_proj,), layer.down)):
            own = fused.quantized if isinstance(fused, RowDispatch) else fused
            rounds_inputs |= isinstance(own, BlockLinear)
            for linear, rounded in zip(linears, _rounded_weights(own, [lin.weight.detach() for lin in linears]),
                                       strict=True):
                linear.weight.data.copy_(rounded)
    head = model.forward_pass.lm_head  # six rows: the quantized head of a RowDispatch
    head = head.quantized if isinstance(head, RowDispatch) else head
    if isinstance(head, BlockLinear):
        reference.lm_head.weight = torch.nn.Parameter(head.dequantized())
    ids = [1, 504, 3458, 282, 9690, 17]
    batch = batch_of(model, [request(1, ids, 3, ignore_eos=True)])
    logits, _ = model.forward(batch, all_positions=True)
    with torch.inference_mode():
        outputs = reference(torch.tensor([ids]), output_hidden_states=True)
    if rounds_inputs:
        torch.testing.assert_close(logits, outputs.logits, rtol=0.05, atol=0.05)
    else:
        tolerance = 1e-4 + (_input_rounding_bound(head, outputs.hidden_states[-1][0])
                            if isinstance(head, Int8BlockLinear) else 0)
        assert ((logits - outputs.logits).abs() <= tolerance).all()
    assert len(token_ids(run_to_end(model, batch_of(model, [request(2, ids, 4, ignore_eos=True)])))[2]) == 4


def _rounded_weights(layer, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """The weights a quantized layer computes with, split back into the separate matrices it stacks."""
    if isinstance(layer, (BlockLinear, Int8Linear)):
        return list(layer.dequantized().split([w.shape[0] for w in weights]))
    return [quantize_int4(w).dequantized() for w in weights]  # torch's int4 layer, from float


def _input_rounding_bound(head: Int8BlockLinear, hidden: torch.Tensor) -> torch.Tensor:
    """How far a Q8_0 product can move from the float one by rounding its input rows: half a step of
    each block's scale, times the weights' magnitudes. `[rows, out]`."""
    blocks = hidden.float().view(hidden.shape[0], -1, BLOCK_SIZE)
    half_steps = (blocks.abs().amax(dim=-1) / 127 / 2).repeat_interleave(BLOCK_SIZE, dim=1)
    return half_steps @ head.dequantized().abs().T


def test_quantize_needs_the_native_forward(tiny_model_dir):
    with pytest.raises(ValueError, match="native forward"):
        load_model(tiny_model_dir, dtype="float32", device="cpu", backend="transformers", kv_cache="padded",
                   quantize="int8")


def test_auto_dtype_with_quantize_is_bfloat16_where_the_cpu_has_it(tiny_model_dir):
    """torch's quantized kernels are scalar loops in float32: `auto` takes bfloat16 where it can."""
    from ztgi.services.worker.models.dtype_choice import cpu_has_bf16_matrix_units

    model = load_model(tiny_model_dir, dtype="auto", device="cpu", quantize="int4")
    assert model.dtype == (torch.bfloat16 if cpu_has_bf16_matrix_units() else torch.float32)


def test_quantize_flag_and_environment(monkeypatch):
    """--quantize and ZTGI_QUANTIZE reach the worker's config; the launcher passes it on to every
    child; a value outside auto/none/gguf/int8/int4 is a config error."""
    assert parse_config(WorkerConfig, []).quantize == "auto"
    assert parse_config(WorkerConfig, ["--quantize", "int4"]).quantize == "int4"
    monkeypatch.setenv("ZTGI_QUANTIZE", "int8")
    assert parse_config(WorkerConfig, []).quantize == "int8"
    assert parse_config(LaunchConfig, []).shared_environment("tcp://x:1")["ZTGI_QUANTIZE"] == "int8"
    with pytest.raises(ConfigError, match="--quantize"):
        parse_config(WorkerConfig, ["--quantize", "int2"])


def test_group_codes_concatenate_by_rows():
    a, b = quantize_int4(_weight(8, 64, 1)), quantize_int4(_weight(4, 64, 2))
    both = GroupCodes.concat([a, b])
    assert torch.equal(both.dequantized(), torch.cat([a.dequantized(), b.dequantized()]))


def test_paged_model_builds_quantized_layers_and_matches_padded(tiny_model_dir):
    """The paged forward takes the same layers: int4 weights give the padded backend's tokens."""
    padded = load_model(tiny_model_dir, dtype="float32", device="cpu", kv_cache="padded", quantize="int4")
    paged = load_model(tiny_model_dir, dtype="float32", device="cpu", kv_cache="paged", quantize="int4")
    gate_up = paged.forward_pass.weights.layers[0].gate_up
    assert isinstance(gate_up, RowDispatch) and isinstance(gate_up.quantized, (Int4Linear, Int4BlockLinear))
    paged.allocate_pool(64)
    requests = [request(1, [1, 504, 3458, 282], 5, ignore_eos=True), request(2, [9690, 17], 3, ignore_eos=True)]
    assert (token_ids(run_to_end(paged, batch_of(paged, requests)))
            == token_ids(run_to_end(padded, batch_of(padded, requests))))


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_row_dispatch_sends_small_calls_to_the_quantized_weights_and_large_ones_to_float(tiny_reference, quantize):
    """With `max_rows`, a call of up to that many rows is the quantized layer's product and a larger
    one the packed float weights' (prefill chunks, where the quantized kernels are slower); without
    it the layer is the quantized one alone, and no float copy is kept."""
    mlp = tiny_reference.model.layers[0].mlp
    weights = (mlp.gate_proj.weight, mlp.up_proj.weight)
    layer = LinearFactory(quantize, tiny_reference, None, torch.float32, max_rows=4)(*weights)
    assert isinstance(layer, RowDispatch)
    bare = LinearFactory(quantize, tiny_reference, None, torch.float32)(*weights)
    assert isinstance(bare, Int8Linear if quantize == "int8" else (Int4Linear, Int4BlockLinear))
    dense = PackedLinear(torch.cat(weights))
    x = torch.randn(9, mlp.gate_proj.in_features, generator=torch.Generator().manual_seed(3))
    assert torch.equal(layer(x[:4]), bare(x[:4])) and not torch.equal(layer(x[:4]), dense(x[:4]))
    assert torch.equal(layer(x[None, :4]), bare(x[None, :4]))
    assert torch.equal(layer(x[:5]), dense(x[:5])) and torch.equal(layer(x), dense(x))


def test_quantized_max_rows_reaches_the_layers_and_the_log_line(tiny_model_dir):
    """The default keeps a float copy above 16 rows for ztgi's 4-bit block products and above 8 for
    torch's int8 kernel and the Q8_0 lm_head, and the log line says so; `None` keeps the quantized
    weights alone; the loaded model carries the choice to the forward's layers."""
    from ztgi.services.worker.layers.quantization.factory import factory

    default = load_model(tiny_model_dir, dtype="bfloat16", device="cpu", kv_cache="paged", quantize="int8")
    qkv = default.forward_pass.weights.layers[0].qkv
    assert isinstance(qkv, RowDispatch) and qkv.max_elements == FALLBACK_QUANTIZED_MAX_ROWS * qkv.in_features
    assert default.info().quantize == "int8"  # the worker tells the scheduler, /info shows it
    int4 = load_model(tiny_model_dir, dtype="bfloat16", device="cpu", kv_cache="paged", quantize="int4")
    layer, head = int4.forward_pass.weights.layers[0].qkv, int4.forward_pass.weights.lm_head
    if isinstance(layer.quantized, Int4BlockLinear):
        assert layer.max_elements == DEFAULT_QUANTIZED_MAX_ROWS * layer.in_features
        assert head.max_elements == FALLBACK_QUANTIZED_MAX_ROWS * head.in_features
        described = LinearFactory("int4", int4.loaded.module, None, torch.bfloat16, DEFAULT_QUANTIZED_MAX_ROWS)
        described(*[p.weight for p in (int4.loaded.module.model.layers[0].mlp.down_proj,)])
        described(int4.loaded.module.lm_head.weight)
        assert described.describe() == "1 int4, 1 Q8_0 lm_head (float above 16 rows; Q8_0 lm_head above 8)"
    alone = load_model(tiny_model_dir, dtype="bfloat16", device="cpu", kv_cache="paged", quantize="int8",
                       quantized_max_rows=None)
    assert isinstance(alone.forward_pass.weights.layers[0].qkv, Int8Linear)
    linear = factory("int4", alone.loaded.module, None, "native", torch.device("cpu"), torch.bfloat16, 8)
    linear(_weight(64, 64))
    assert linear.describe() == "1 int4 (float above 8 rows)"
    with pytest.raises(ValueError, match="--quantized-max-rows"):
        factory("int4", alone.loaded.module, None, "native", torch.device("cpu"), torch.bfloat16, 0)


def test_quantized_max_rows_flag_and_environment(monkeypatch):
    """--quantized-max-rows N or none reaches the worker, and the launcher passes none on as none
    (not as an absent variable, which would be the worker's default)."""
    assert parse_config(WorkerConfig, []).quantized_max_rows == DEFAULT_QUANTIZED_MAX_ROWS
    assert parse_config(WorkerConfig, ["--quantized-max-rows", "none"]).quantized_max_rows is None
    assert parse_config(WorkerConfig, ["--quantized-max-rows", "4"]).quantized_max_rows == 4
    launch = parse_config(LaunchConfig, ["--quantized-max-rows", "none"])
    assert launch.shared_environment("tcp://x:1")["ZTGI_QUANTIZED_MAX_ROWS"] == "none"
    monkeypatch.setenv("ZTGI_QUANTIZED_MAX_ROWS", "none")
    assert parse_config(WorkerConfig, []).quantized_max_rows is None
    for config in (WorkerConfig, LaunchConfig):
        with pytest.raises(ConfigError, match="--quantized-max-rows"):
            parse_config(config, ["--quantized-max-rows", "0"])
