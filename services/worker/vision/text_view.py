"""A vision-language model seen as the causal LM its text part is, for the code that builds forwards."""

from __future__ import annotations

import torch

from ztgi.services.worker.layers.transformers_module import TransformersConfig, TransformersModule


class TextView(torch.nn.Module):
    """`.config` (the text config), `.model` (the language model: embed_tokens, layers, norm,
    rotary_emb) and `.lm_head`, sharing the multimodal model's modules: the native forwards,
    LoRA's targets and the quantization factory read a causal LM by these names."""

    def __init__(self, config: TransformersConfig, model: TransformersModule, lm_head: TransformersModule,
                 generation_config: object) -> None:
        super().__init__()
        self.config = config
        self.model = model
        self.lm_head = lm_head
        self.generation_config = generation_config

    @classmethod
    def of(cls, multimodal: TransformersModule) -> TextView:
        """The view of an `AutoModelForImageTextToText` model (Idefics3: `model.text_model`,
        Qwen2-VL: `model.language_model`)."""
        inner = multimodal.model
        language = getattr(inner, "text_model", None) or inner.language_model
        return cls(language.config, language, multimodal.lm_head, multimodal.generation_config)
