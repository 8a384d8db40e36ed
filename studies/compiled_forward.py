"""The paged forward eager against `torch.compile` of its dense parts, on SmolLM2 at a server's step shapes.

    python -m studies.compiled_forward --dtype float32 --repeats 5
    python -m studies.compiled_forward --dtype bfloat16 --variants eager,compiled,autotune-plain

Attention stays eager (its Python loops over decode groups and prefill spans would break any graph);
what is compiled is each layer's part before it (RMSNorm, fused q/k/v, rotary) and after it (output
projection, residual, RMSNorm, gate/up, SiLU, down, residual): one function each, the layer's
weights passed as inputs, so every layer reuses one graph per shape. The variants:

- `eager`: the worker's forward as it runs today (`PackedLinear`: oneDNN-packed linears, or on an
  AVX2 CPU in float32 plain weights with a decode step's rows in ztgi's C)
- `compiled`: the dense parts compiled (`dynamic=True`: one graph for every token count above 1),
  the linears oneDNN's on the worker's own weights, packed where it packs them (a custom op wraps
  the product, which inductor cannot lower on a packed weight)
- `compiled-static`: the same with `dynamic=False`, a graph per token count: the best a set of
  bucketed static shapes can do (no padding counted)
- `compiled-plain`: dynamic, plain weights and `F.linear`, so inductor chooses the matrix products
- `autotune-plain`: static, plain weights, `mode="max-autotune"` (inductor's C++ GEMM templates
  among its candidates)
- `eager-float32-decode`: eager with `--float32-decode-attention` (bfloat16 decode rows attend in
  float32; the same as `eager` in float32)
- `eager-per-head-decode`: eager with each query head of a decode row attending on its own (one
  kernel call per query head, as before grouped-query decode attention)
- `eager-torch-attention`: eager with attention on torch's gather-and-SDPA path instead of the
  C kernels that read the blocks in place (`native_attention.py`; the same as `eager` where they
  are not built)
- `eager-torch-layer-steps`: eager with the residual adds, RMSNorms, SiLU gates and rotary as torch
  ops instead of ztgi's C (`layer_ops.py`)

The step shapes: decode batches (one token per request over `--context` cached tokens each) and one
prefill chunk. Each variant first runs every shape twice (compiles; the time is printed, with
inductor's on-disk cache as it is), its logits are compared with eager's, then the variants take
turns shape by shape for `--repeats` rounds (A B A B) and the median of each is printed with its
ratio to eager.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ztgi.common.config import parse_config, require
from ztgi.common.messages import SamplingParameters, WorkerRequest
from ztgi.services.worker.layers.layer_ops import TorchLayerOps
from ztgi.services.worker.layers.norm import rms_norm
from ztgi.services.worker.layers.rotary import rotate
from ztgi.services.worker.model_loader import load_paged_model
from ztgi.services.worker.paged.batch import PagedBatch
from ztgi.services.worker.paged.step_inputs import StepInputs, build_step_inputs

VARIANTS = ("eager", "compiled", "compiled-static", "compiled-plain", "autotune-plain", "eager-float32-decode",
            "eager-per-head-decode", "eager-torch-attention", "eager-torch-layer-steps")


@dataclasses.dataclass(frozen=True)
class CompiledForwardConfig:
    """Step times of the paged forward, eager against compiled dense parts."""

    model_id: str = dataclasses.field(default="smollm2", metadata={"help": "a Llama model the paged engine serves"})
    dtype: str = dataclasses.field(default="float32", metadata={"help": "float32 or bfloat16"})
    variants: str = dataclasses.field(default="eager,compiled,compiled-static,compiled-plain",
                                      metadata={"help": "which of " + ",".join(VARIANTS)})
    decode_batches: str = dataclasses.field(default="1,16,32", metadata={"help": "decode batch sizes"})
    prefill_tokens: int = dataclasses.field(default=512, metadata={"help": "the prefill chunk's tokens"})
    context: int = dataclasses.field(default=300, metadata={"help": "cached tokens of each decoding request"})
    repeats: int = 5
    num_threads: int | None = None  # torch's default, every core, as the worker

    def __post_init__(self) -> None:
        require(self.dtype in ("float32", "bfloat16"), "--dtype must be float32 or bfloat16")
        require(all(v in VARIANTS for v in self.variants.split(",")), f"--variants among {','.join(VARIANTS)}")
        require(self.variants.split(",")[0] == "eager", "--variants must start with eager (the reference)")
        require(self.repeats >= 1 and self.prefill_tokens >= 1 and self.context >= 1,
                "--repeats, --prefill-tokens and --context must be >= 1")


@torch.library.custom_op("ztgi_bench::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, out_features: int) -> torch.Tensor:
    """oneDNN's product on the worker's weight, opaque to inductor (its lowering rejects a packed weight)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


class DenseParts:
    """A layer's dense parts around attention, as plain functions of tensors (compiled or not)."""

    def __init__(self, forward: Any, packed: bool) -> None:
        w = forward.weights
        self.sizes = [w.num_heads * w.head_dim, w.num_kv_heads * w.head_dim, w.num_kv_heads * w.head_dim]
        self.heads, self.kv_heads, self.head_dim = w.num_heads, w.num_kv_heads, w.head_dim
        self.intermediate, self.eps, self.packed = w.intermediate_size, w.eps, packed

    def linear(self, x: torch.Tensor, weight: torch.Tensor, out_features: int) -> torch.Tensor:
        return packed_linear(x, weight, out_features) if self.packed else F.linear(x, weight)

    def pre(self, x: torch.Tensor, norm: torch.Tensor, qkv: Any, cos: torch.Tensor,
            sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = x.shape[0]
        q, k, v = self.linear(rms_norm(x, norm, self.eps), qkv, sum(self.sizes)).split(self.sizes, dim=-1)
        return (rotate(q.view(n, self.heads, self.head_dim), cos, sin),
                rotate(k.view(n, self.kv_heads, self.head_dim), cos, sin), v.reshape(n, self.kv_heads, self.head_dim))

    def post(self, x: torch.Tensor, attended: torch.Tensor, output: Any, mlp_norm: torch.Tensor, gate_up: Any,
             down: Any) -> torch.Tensor:
        x = x + self.linear(attended, output, x.shape[1])
        gate, up = self.linear(rms_norm(x, mlp_norm, self.eps), gate_up, 2 * self.intermediate).split(
            self.intermediate, dim=-1)
        return x + self.linear(F.silu(gate) * up, down, x.shape[1])


def _layer_weights(model: Any, packed: bool) -> list[tuple[torch.Tensor, ...]]:
    """(q/k/v, output, gate/up, down) per layer: the packed ones the worker holds, or plain copies."""
    if packed:
        return [(layer.qkv.weight, layer.output.weight, layer.gate_up.weight, layer.down.weight)
                for layer in model.forward_pass.weights.layers]
    weights = []
    for block in model.loaded.module.model.layers:
        a, m = block.self_attn, block.mlp
        weights.append(tuple(t.detach().contiguous() for t in (
            torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), a.o_proj.weight,
            torch.cat([m.gate_proj.weight, m.up_proj.weight]), m.down_proj.weight)))
    return weights


def variant_forward(model: Any, variant: str) -> Callable[..., torch.Tensor]:
    """The paged forward with `variant`'s dense parts; attention is the worker's own."""
    forward = model.forward_pass
    if variant == "eager":
        return forward
    if variant == "eager-float32-decode":
        return _with_attention_flag(forward, "float32_decode", True)
    if variant == "eager-per-head-decode":
        return _with_attention_flag(forward, "group_query_heads", False)
    if variant == "eager-torch-attention":
        return _with_attention_flag(forward, "native", None)
    if variant == "eager-torch-layer-steps":
        return _with_attribute(forward, forward, "ops", TorchLayerOps())
    packed = not variant.endswith("-plain")
    parts = DenseParts(forward, packed)
    dynamic = variant in ("compiled", "compiled-plain")
    mode = "max-autotune" if variant.startswith("autotune") else None
    pre = torch.compile(parts.pre, dynamic=dynamic, mode=mode)
    post = torch.compile(parts.post, dynamic=dynamic, mode=mode)
    weights, w = _layer_weights(model, packed), forward.weights

    def run(input_ids: torch.Tensor, positions: torch.Tensor, inputs: Any, pool: Any,
            logit_rows: Any) -> torch.Tensor:
        x = w.embed(input_ids)
        cos, sin = w.rotary.cos_sin(x, positions)
        for index, (layer, (qkv, output, gate_up, down)) in enumerate(zip(w.layers, weights)):
            q, k, v = pre(x, layer.attention_norm, qkv, cos, sin)
            x = post(x, forward.attention(index, q, k, v, pool, inputs), output, layer.mlp_norm, gate_up, down)
        return w.lm_head(rms_norm(x.index_select(0, logit_rows), w.norm, w.eps))
    return run


def _with_attention_flag(forward: Any, name: str, value: object) -> Callable[..., torch.Tensor]:
    """The eager forward with one of its attention's switches (or its C kernels) set for the call."""
    return _with_attribute(forward, forward.attention, name, value)


def _with_attribute(forward: Any, owner: object, name: str, value: object) -> Callable[..., torch.Tensor]:
    """The eager forward with `owner.name` set to `value` for the call."""
    def run(*args: Any) -> torch.Tensor:
        before = getattr(owner, name)
        setattr(owner, name, value)
        try:
            return forward(*args)
        finally:
            setattr(owner, name, before)
    return run


def step_shapes(model: Any, decode_batches: Sequence[int], prefill_tokens: int, context: int) -> dict[str, StepInputs]:
    """Decode steps (their prompts prefilled first, so attention reads real keys) and a prefill chunk."""
    shapes: dict[str, StepInputs | None] = {}
    next_block = 0
    for size in decode_batches:
        blocks_each = -(-(context + 2) // model.block_size)
        first = [next_block + i * blocks_each for i in range(size)]
        requests = [WorkerRequest(i, [(7 * i + 13 * j) % model.vocab_size for j in range(context)],
                                  SamplingParameters(), 2, True,
                                  block_ids=list(range(first[i], first[i] + blocks_each)))
                    for i in range(size)]
        next_block += size * blocks_each
        batch = PagedBatch.from_requests(requests, size, 2**62, model)
        model.generate_token(batch)
        shapes[f"decode {size}"] = build_step_inputs(batch, model.pool)
    blocks = list(range(next_block, next_block + -(-prefill_tokens // model.block_size)))
    request = WorkerRequest(10**6, [(13 * j) % model.vocab_size for j in range(prefill_tokens)],
                            SamplingParameters(), 2, True, block_ids=blocks)
    shapes[f"prefill {prefill_tokens}"] = build_step_inputs(
        PagedBatch.from_requests([request], 0, 2**62, model), model.pool)
    return {name: inputs for name, inputs in shapes.items() if inputs is not None}


def call_forward(forward: Any, inputs: StepInputs, pool: Any) -> torch.Tensor:
    return forward(inputs.input_ids, inputs.positions, inputs.attention, pool, inputs.logit_rows)


def first_calls(forwards: dict[str, Any], shapes: dict[str, StepInputs],
                pool: Any) -> dict[str, dict[str, torch.Tensor]]:
    """Each variant's logits per shape, after two calls (the compile), with the compile time printed."""
    logits: dict[str, dict[str, torch.Tensor]] = {}
    for name, forward in forwards.items():
        started = time.perf_counter()
        logits[name] = {shape: (call_forward(forward, inputs, pool), call_forward(forward, inputs, pool))[1]
                        for shape, inputs in shapes.items()}
        print(f"{name}: first two calls of every shape {time.perf_counter() - started:.1f} s", flush=True)
    for name in list(forwards)[1:]:
        for shape, out in logits[name].items():
            ref = logits["eager"][shape]
            same = int((out.argmax(-1) == ref.argmax(-1)).sum())
            print(f"  {name} {shape}: max |logit - eager| {(out.float() - ref.float()).abs().max().item():.2e}, "
                  f"argmax equal in {same}/{len(ref)} rows")
    return logits


def interleaved_ms(forwards: dict[str, Any], shapes: dict[str, StepInputs], pool: Any,
                   repeats: int) -> dict[tuple[str, str], float]:
    """Median ms per (variant, shape); variants take turns call by call."""
    times: dict[tuple[str, str], list[float]] = {(n, s): [] for n in forwards for s in shapes}
    for _ in range(repeats):
        for shape, inputs in shapes.items():
            for name, forward in forwards.items():
                started = time.perf_counter()
                call_forward(forward, inputs, pool)
                times[(name, shape)].append(time.perf_counter() - started)
    return {key: statistics.median(values) * 1e3 for key, values in times.items()}


@torch.inference_mode()
def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(CompiledForwardConfig, argv, prog="python -m studies.compiled_forward")
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    torch._dynamo.config.recompile_limit = 64  # the variants share the parts' code objects and their cache
    model = load_paged_model(config.model_id, dtype=config.dtype, device="cpu")
    batches = [int(b) for b in config.decode_batches.split(",")]
    model.allocate_pool(sum(b * -(-(config.context + 2) // model.block_size) for b in batches)
                        + -(-config.prefill_tokens // model.block_size) + 1)
    shapes = step_shapes(model, batches, config.prefill_tokens, config.context)
    forwards = {name: variant_forward(model, name) for name in config.variants.split(",")}
    first_calls(forwards, shapes, model.pool)
    ms = interleaved_ms(forwards, shapes, model.pool, config.repeats)
    print(f"{config.dtype}, {torch.get_num_threads()} thread(s), median of {config.repeats} (ms, ratio to eager)")
    print(f"{'shape':>12} " + " ".join(f"{name:>22}" for name in forwards))
    for shape in shapes:
        base = ms[("eager", shape)]
        print(f"{shape:>12} " + " ".join(f"{ms[(n, shape)]:>13.1f} ({base / ms[(n, shape)]:.2f}x)" for n in forwards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
