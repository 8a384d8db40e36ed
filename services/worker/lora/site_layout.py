"""Where adapters apply in a decoder layer: four products, each computing one or more of PEFT's
modules side by side in its output (ztgi fuses q/k/v and gate/up into one product each)."""

from __future__ import annotations

import dataclasses

from ztgi.services.worker.layers.transformers_module import TransformersModule

# each product's modules in output order: split as most families store them, or fused as Phi-3 does
SITE_MODULES: dict[str, tuple[tuple[str, ...], ...]] = {
    "qkv": (("q_proj", "k_proj", "v_proj"), ("qkv_proj",)),
    "output": (("o_proj",),),
    "gate_up": (("gate_proj", "up_proj"), ("gate_up_proj",)),
    "down": (("down_proj",),),
}


@dataclasses.dataclass(frozen=True)
class SiteLayout:
    """One product of every layer: its input width and its modules' output widths, in order."""

    name: str
    in_features: int
    modules: tuple[str, ...]
    widths: tuple[int, ...]

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each module's outputs start in the product's output."""
        starts, total = [], 0
        for width in self.widths:
            starts.append(total)
            total += width
        return tuple(starts)

    @property
    def out_features(self) -> int:
        return sum(self.widths)


def lora_targets(module: TransformersModule) -> dict[str, list[int]]:
    """Every linear of a decoder layer an adapter may target: PEFT's module name -> [in, out];
    empty where the layers lack one of the four products' modules (no adapters served)."""
    block = module.model.layers[0]
    found = {}
    for parent in (block.self_attn, block.mlp):
        for name in {name for variants in SITE_MODULES.values() for group in variants for name in group}:
            linear = getattr(parent, name, None)
            weight = getattr(linear, "weight", None)
            if weight is not None:
                found[name] = [int(weight.shape[1]), int(weight.shape[0])]
    try:
        site_layouts(found)
    except TypeError:
        return {}
    return found


def site_layouts(targets: dict[str, list[int]]) -> list[SiteLayout]:
    """The four products' layouts for a model with these linears."""
    layouts = []
    for site, variants in SITE_MODULES.items():
        modules = next((group for group in variants if all(name in targets for name in group)), None)
        if modules is None:
            raise TypeError(f"the model's layers have none of {variants} for LoRA's {site} product")
        layouts.append(SiteLayout(site, targets[modules[0]][0], modules, tuple(targets[m][1] for m in modules)))
    return layouts
