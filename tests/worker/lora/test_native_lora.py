"""The C adapter products equal the masked torch product they replace (bfloat16), row by row."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ztgi.common.lora_adapter import AdapterModule, AdapterSpec
from ztgi.services.worker.lora.adapter_weights import AdapterWeights
from ztgi.services.worker.lora.lora_linear import LoraLinear, LoraStep
from ztgi.services.worker.lora.native_lora import NativeLora
from ztgi.services.worker.lora.site_layout import SiteLayout
from ztgi.services.worker.lora.stacked_adapters import stack

NEAR_TIE = 0.25  # logprob gap: a few bfloat16 steps at this model's logits (as test_kernel_fallback.py)
LAYOUT = SiteLayout("qkv", 96, ("q_proj", "k_proj", "v_proj"), (96, 32, 48))


def _adapter(seed: int, rank: int, modules: tuple[str, ...]) -> AdapterWeights:
    generator = torch.Generator().manual_seed(seed)
    tensors, specs = {}, {}
    for module in modules:
        width = LAYOUT.widths[LAYOUT.modules.index(module)]
        a = torch.randn(rank, LAYOUT.in_features, generator=generator).to(torch.bfloat16)
        b = (torch.randn(width, rank, generator=generator) / rank).to(torch.bfloat16)
        tensors[(0, module)] = (a, b.T.contiguous())
        specs[(0, module)] = AdapterModule(0, module, rank, 1.0, LAYOUT.in_features, width)
    return AdapterWeights(AdapterSpec("", specs, {}), tensors)


def test_c_products_equal_the_masked_product():
    native = NativeLora.load([LAYOUT], torch.bfloat16, torch.device("cpu"))
    if native is None:
        pytest.skip("the C kernels cannot run on this CPU")
    adapters = [_adapter(1, 8, ("q_proj", "v_proj")), _adapter(2, 16, LAYOUT.modules), _adapter(3, 4, ("k_proj",))]
    row_slots = torch.tensor([0, 1, 2, 3, 2, 2, 0, 1, 3], dtype=torch.int32)
    x = torch.randn(len(row_slots), LAYOUT.in_features).to(torch.bfloat16)
    base = torch.randn(len(row_slots), LAYOUT.out_features).to(torch.bfloat16)

    torch_step = LoraStep(sites=stack(adapters, [LAYOUT], 1, torch.bfloat16, torch.device("cpu")), row_slots=row_slots)
    site = torch_step.sites["qkv"]
    torch_step.masks = {"qkv": (row_slots[:, None] == site.column_slots[None, :]).to(torch.bfloat16)}
    native_step = LoraStep(sites=stack(adapters, [LAYOUT], 1, torch.bfloat16, torch.device("cpu"), native=True),
                           row_slots=row_slots, native=native)
    expected = LoraLinear(lambda _: base.clone(), torch_step, "qkv", 0)(x)
    got = LoraLinear(lambda _: base.clone(), native_step, "qkv", 0)(x)
    assert torch.equal(got[row_slots == 0], base[row_slots == 0])
    assert torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
    assert (got != base).any(dim=1)[row_slots != 0].all()


def test_embedded_gguf_with_an_adapter_same_tokens_on_both_paths(smollm2, tmp_path):
    """The default launch's model (SmolLM2's GGUF blocks as stored, bfloat16) with an adapter on
    every projection: the adapter changes the answer, and the C products and the masked torch
    product give the same greedy tokens, up to a bfloat16 near-tie (their dot products round
    apart by an ulp now and then)."""
    from tests.lora_adapters import ATTENTION, MLP, AdapterRecipe, save_adapter
    from tests.worker.engine_helpers import batch_of, request, run_to_end
    from ztgi.bench.greedy_parity import GreedyStream, greedy_difference
    from ztgi.common.messages import AdapterRef
    from ztgi.services.worker.model_loader import load_model

    recipe = AdapterRecipe(8, tuple(ATTENTION + MLP), alpha=4.0, seed=3)
    ref = AdapterRef("a", save_adapter(smollm2.path, str(tmp_path / "adapter"), recipe), 1)
    model = load_model("smollm2", dtype="bfloat16", device="cpu", kv_cache="paged")
    model.allocate_pool(256)
    prompt = list(range(1000, 1040))
    requests = [dataclasses.replace(request(i, prompt, 12, ignore_eos=True, top_n_tokens=2), adapter=adapter)
                for i, adapter in enumerate([None, None, ref, ref])]

    def streams() -> list[GreedyStream]:
        runs = run_to_end(model, batch_of(model, requests))
        return [GreedyStream(ids=[g.token_id for g in runs[i]], texts=[str(g.token_id) for g in runs[i]],
                             top2=[list(zip(g.top_ids, g.top_logprobs, strict=True)) for g in runs[i]])
                for i in range(len(requests))]

    native = streams()
    if model.lora.step.native is None:  # built with the first adapter
        pytest.skip("the C kernels cannot run on this CPU")
    model.lora.step.native = None
    model.lora._stacked = []  # restacked for the masked product at the next step
    masked = streams()
    for one, other in zip(native, masked, strict=True):
        assert greedy_difference(one, other, NEAR_TIE) is None, greedy_difference(one, other, NEAR_TIE)
    assert native[0].ids == native[1].ids and native[2].ids == native[3].ids and native[0].ids != native[2].ids
