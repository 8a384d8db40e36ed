"""The C adapter products equal the masked torch product they replace (bfloat16), row by row."""

from __future__ import annotations

import pytest
import torch

from ztgi.common.lora_adapter import AdapterModule, AdapterSpec
from ztgi.services.worker.lora.adapter_weights import AdapterWeights
from ztgi.services.worker.lora.lora_linear import LoraLinear, LoraStep
from ztgi.services.worker.lora.native_lora import NativeLora
from ztgi.services.worker.lora.site_layout import SiteLayout
from ztgi.services.worker.lora.stacked_adapters import stack

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
