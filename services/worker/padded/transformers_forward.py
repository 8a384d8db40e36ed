"""The forward pass of any `AutoModelForCausalLM`, through the `transformers` module itself.

The generic backend: whatever architecture `transformers` knows, with the batch's `KVCache`
buffers handed to it as a `Cache` whose layers write in place.
"""

from __future__ import annotations

import torch

from ztgi.services.worker.layers.transformers_module import TransformersModule
from ztgi.services.worker.padded import kv_cache
from ztgi.services.worker.padded.kv_cache import KVCache


class TransformersForward:
    """Logits for a padded batch from the `transformers` module, writing into the batch's cache."""

    def __init__(self, model: TransformersModule) -> None:
        kv_cache.check_supported(model.config)
        self.model = model

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                 cache: KVCache, num_logits: int) -> torch.Tensor:
        """Logits `[batch, positions, vocab]` of the last `num_logits` positions (0: all of them)."""
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=cache.for_forward(), use_cache=True, logits_to_keep=num_logits)
        return outputs.logits
