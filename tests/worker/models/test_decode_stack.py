"""Decode steps' layers in one C call: the same tokens and logprobs as the step called layer by layer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.worker.engine_helpers import batch_of, request, run_to_end
from ztgi.services.worker.kernels.native_attention import NativeAttention
from ztgi.services.worker.layers.attention import AttentionInputs, decode_groups
from ztgi.services.worker.layers.layer_ops import NativeLayerOps, TorchLayerOps
from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.block_linear import BlockLinear
from ztgi.services.worker.model_loader import load_paged_model
from ztgi.services.worker.models.llama_decode_stack import NativeDecodeStack

PRODUCTS = ("qkv", "output", "gate_up", "down")  # a layer's block products
STACK_ROWS = 16  # the stack's row limit here (the products' own is higher), so 17 rows show the fallback
PROMPTS = [[1, 504, 3458, 282, 9690, 17], [9690, 17, 28, 1073], list(range(300, 340))]


@pytest.fixture(scope="module", params=["bfloat16", "float32", "float32-one-level"])
def dtype(request) -> str:
    """The activations' dtype: bfloat16 takes the AVX512-BF16 kernels, float32 the AVX2 ones, its
    rows rounded to two int8 levels or (the serving dtype on a CPU without bfloat16 units) one."""
    return request.param


def load_as_stored(dtype: str):
    """The embedded GGUF served as stored (its Q4_1 blocks), where this CPU builds the stack's kernels:
    checked first, so a skip costs no model load."""
    activations = torch.float32 if dtype.startswith("float32") else torch.bfloat16
    if NativeAttention.load(activations) is None or NativeLayerOps.load(activations) is None:
        needs = "AVX512-VNNI/BF16" if activations is torch.bfloat16 else "AVX2"
        pytest.skip(f"no {needs} CPU or no C compiler here: the {dtype} stack is not built")
    model = load_paged_model("smollm2", dtype=dtype.removesuffix("-one-level"), device="cpu", quantize="auto")
    if model.forward_pass.stack is None:
        pytest.skip(f"this CPU has no block products for {dtype} rows: the stack is not built")
    return model


def set_levels(model, dtype: str) -> None:
    """Every decoder product's float32 rows at one level for `float32-one-level` (as the loader sets
    them for `--dtype auto` without bfloat16 units), before the stack describes them."""
    for layer in model.forward_pass.weights.layers:
        for name in PRODUCTS:
            getattr(layer, name).float32_levels = 1 if dtype.endswith("one-level") else 2


@pytest.fixture(scope="module")
def int4_model(dtype):
    """The embedded SmolLM2 as stored (its own 4-bit blocks), where the stack can run."""
    model = load_as_stored(dtype)
    set_levels(model, dtype)
    model.forward_pass.stack.max_rows = STACK_ROWS
    model.allocate_pool(256)
    return model


def six_bit(layer: BlockLinear) -> BlockLinear:
    """Q6_K's form of the layer's weights: 6-bit codes by sub-blocks of 16, offsets -32 scales."""
    weights = layer.dequantized().view(layer.out_features, -1, 16)
    scales = (weights.abs().amax(-1) / 31).clamp(min=1e-8)
    codes = (torch.round(weights / scales[..., None]).clamp(-32, 31) + 32).to(torch.uint8)
    six = BlockLinear.load(BlockCodes.plain(codes.view(layer.out_features, -1), 6, 16, scales, -32 * scales))
    assert six is not None
    return six


@pytest.fixture(scope="module")
def six_bit_model(dtype):
    """The embedded SmolLM2 with every decoder product's weights as 6-bit codes by 16 (Q6_K's form)."""
    model = load_as_stored(dtype)
    forward = model.forward_pass
    layers = forward.weights.layers
    for i, layer in enumerate(layers):
        layers[i] = dataclasses.replace(layer, **{name: six_bit(getattr(layer, name)) for name in PRODUCTS})
    set_levels(model, dtype)
    forward.stack = NativeDecodeStack.load(forward)
    assert forward.stack is not None and all(linear.bits == 6 for layer in forward.stack.linears for linear in layer)
    forward.stack.max_rows = STACK_ROWS
    model.allocate_pool(256)
    return model


@pytest.fixture(params=["int4", "six_bit"])
def quantized_model(request, dtype):
    return request.getfixturevalue(f"{request.param}_model")


def generate(model, requests, stack: NativeDecodeStack | None, calls: list[int]):
    model.forward_pass.stack = stack
    if stack is not None:
        run = stack.run

        def counted(*args):
            calls.append(args[0].shape[0])
            return run(*args)

        stack.run = counted
    try:
        generations = run_to_end(model, batch_of(model, requests))
    finally:
        if stack is not None:
            del stack.run
    return {rid: [(g.token_id, g.logprob, g.top_ids, g.top_logprobs) for g in gens]
            for rid, gens in generations.items()}


@pytest.mark.parametrize("num_requests", [1, 3, 12, 17])
def test_stack_gives_the_tokens_and_logprobs_of_the_layer_by_layer_step(quantized_model, num_requests):
    """Greedy and seeded sampled requests with top tokens, through prefill and decode steps: with
    the stack the generations are those of the step called layer by layer, bit for bit (logprobs
    included), with 4-bit (the GGUF's Q4_1) and 6-bit weights by 16 (Q6_K's form), in bfloat16 and
    in float32 (rows at two int8 levels, and at one); the stack ran every decode step of up to 16
    rows (17 rows: none, they are called layer by layer)."""
    stack = quantized_model.forward_pass.stack
    requests = [request(i + 1, PROMPTS[i % len(PROMPTS)], 10, ignore_eos=True, top_n_tokens=3,
                        **({"do_sample": True, "temperature": 0.8, "seed": i} if i % 2 else {}))
                for i in range(num_requests)]
    calls: list[int] = []
    with_stack = generate(quantized_model, requests, stack, calls)
    layer_by_layer = generate(quantized_model, requests, None, [])
    quantized_model.forward_pass.stack = stack
    assert with_stack == layer_by_layer
    assert len(with_stack) == num_requests and all(len(g) == 10 for g in with_stack.values())
    assert calls == ([] if num_requests > stack.max_rows else [num_requests] * 9)


def test_stack_is_built_only_where_every_layer_kernel_is_ours(int4_model, dtype, tiny_model_dir):
    """Float weights (oneDNN's products), torch's layer steps, or heads too small for the attention
    kernels (16 dimensions) keep the layer-by-layer step. Float weights in float32 keep torch's
    attention and layer steps too: the C kernels' float32 sums would part from transformers' tokens."""
    dtype = dtype.removesuffix("-one-level")
    small_heads = load_paged_model(tiny_model_dir, dtype=dtype, device="cpu", quantize="int4")
    assert small_heads.forward_pass.stack is None
    float_weights = load_paged_model("smollm2", dtype=dtype, device="cpu")
    assert float_weights.forward_pass.stack is None
    assert NativeDecodeStack.load(float_weights.forward_pass) is None
    if dtype == "float32":
        assert float_weights.forward_pass.attention.native is None
        assert isinstance(float_weights.forward_pass.ops, TorchLayerOps)
    forward = int4_model.forward_pass
    native_ops = forward.ops
    forward.ops = TorchLayerOps()
    try:
        assert NativeDecodeStack.load(forward) is None
    finally:
        forward.ops = native_ops


def test_stack_refuses_a_slot_outside_the_pool(int4_model):
    """A step whose key would land outside the pool is refused with an error, not written."""
    stack = int4_model.forward_pass.stack
    pool = int4_model.pool
    x = torch.zeros(1, 576, dtype=stack.dtype)
    cos = torch.ones(1, 1, 64, dtype=stack.dtype)
    groups = decode_groups([[1]], [1], pool.block_size, torch.device("cpu"))
    inputs = AttentionInputs(torch.tensor([pool.num_blocks * pool.block_size]), groups, [])
    with pytest.raises(ValueError, match="refused"):
        stack.run(x, cos, cos, inputs, pool)
