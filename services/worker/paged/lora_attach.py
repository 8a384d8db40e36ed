"""Wraps a paged forward's four products per layer so that the step's adapters add to them."""

from __future__ import annotations

import dataclasses

from ztgi.services.worker.lora.lora_adapters import LoraAdapters
from ztgi.services.worker.lora.lora_linear import Linear
from ztgi.services.worker.models.decoder import PagedDecoderForward
from ztgi.services.worker.models.llama import PagedLlamaForward
from ztgi.services.worker.shards.parallel_layers import RowParallel


def attach(forward_pass: PagedLlamaForward | PagedDecoderForward, adapters: LoraAdapters) -> None:
    """Every layer's q/k/v, output, gate/up and down products become `LoraLinear`s (after the
    one-call decode stack was built from the plain ones: a step with adapters runs layer by layer).
    A shard's row-parallel product adds its adapters to its partial sum, before the all-reduce."""
    forward_pass.lora = adapters.step

    def wrap(product: Linear, site: str, index: int) -> Linear:
        if isinstance(product, RowParallel):
            product.local = adapters.wrap(product.local, site, index)
            return product
        return adapters.wrap(product, site, index)

    if isinstance(forward_pass, PagedLlamaForward):
        layers = forward_pass.weights.layers
        for index, layer in enumerate(layers):
            layers[index] = dataclasses.replace(
                layer, qkv=wrap(layer.qkv, "qkv", index), output=wrap(layer.output, "output", index),
                gate_up=wrap(layer.gate_up, "gate_up", index), down=wrap(layer.down, "down", index))
        return
    decoder_layers = forward_pass.decoder.layers
    for index, block in enumerate(decoder_layers):
        block.qkv.linear = wrap(block.qkv.linear, "qkv", index)
        block.mlp.gate_up = wrap(block.mlp.gate_up, "gate_up", index)
        block.mlp.down = wrap(block.mlp.down, "down", index)
        decoder_layers[index] = dataclasses.replace(block, output=wrap(block.output, "output", index))
