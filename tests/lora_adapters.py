"""Random-weight LoRA adapters made with PEFT for the tests' random-weight models, and the merged
model's greedy tokens they are compared with (no downloads: PEFT builds them from the base)."""

from __future__ import annotations

import dataclasses

import torch

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


@dataclasses.dataclass(frozen=True)
class AdapterRecipe:
    """One adapter: rank, PEFT target modules, alpha, rsLoRA, and the seed of its random weights."""

    rank: int
    targets: tuple[str, ...]
    alpha: float = 16.0
    rslora: bool = False
    seed: int = 0


# three ranks, three target sets, both scalings
RECIPES = {
    "poet": AdapterRecipe(4, ("q_proj", "v_proj"), alpha=8.0, seed=11),
    "coder": AdapterRecipe(8, tuple(MLP), alpha=32.0, seed=12),
    "sage": AdapterRecipe(16, tuple(ATTENTION + MLP), alpha=16.0, rslora=True, seed=13),
}


FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
         "up_proj": "gate_up_proj"}  # Phi-3 stores these fused, and PEFT targets them by those names


def fused_recipe(recipe: AdapterRecipe) -> AdapterRecipe:
    """The recipe for a model with Phi-3's fused projections."""
    return dataclasses.replace(recipe, targets=tuple(dict.fromkeys(FUSED.get(t, t) for t in recipe.targets)))


def save_adapter(base_dir: str, adapter_dir: str, recipe: AdapterRecipe) -> str:
    """An adapter of `recipe` for the model in `base_dir`, its A and B random (PEFT's own init
    would leave B at zero: an adapter that changes nothing), saved in PEFT's format."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=recipe.rank, lora_alpha=recipe.alpha, target_modules=list(recipe.targets),
                        use_rslora=recipe.rslora, init_lora_weights=False, lora_dropout=0.0)
    torch.manual_seed(recipe.seed)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.normal_(0.0, 0.5 / recipe.rank ** 0.5)
    model.save_pretrained(adapter_dir)
    return adapter_dir


def merged_greedy(base_dir: str, adapter_dir: str | None, prompts: list[list[int]],
                  max_new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy tokens from the base with the adapter merged into its weights (PEFT's
    `merge_and_unload`), float32, eager attention; the base alone without an adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    model.eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            tensor = torch.tensor([ids])
            generated = model.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=max_new_tokens,
                                       do_sample=False, pad_token_id=2)
            out.append(generated[0, len(ids):].tolist())
    return out
