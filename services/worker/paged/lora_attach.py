"""Wraps a paged forward's four products per layer so that the step's adapters add to them."""

from __future__ import annotations

import dataclasses

from ztgi.services.worker.lora.lora_adapters import LoraAdapters
from ztgi.services.worker.models.decoder import PagedDecoderForward
from ztgi.services.worker.models.llama import PagedLlamaForward


def attach(forward_pass: PagedLlamaForward | PagedDecoderForward, adapters: LoraAdapters) -> None:
    """Every layer's q/k/v, output, gate/up and down products become `LoraLinear`s (after the
    one-call decode stack was built from the plain ones: a step with adapters runs layer by layer)."""
    forward_pass.lora = adapters.step
    if isinstance(forward_pass, PagedLlamaForward):
        layers = forward_pass.weights.layers
        for index, layer in enumerate(layers):
            layers[index] = dataclasses.replace(
                layer, qkv=adapters.wrap(layer.qkv, "qkv", index), output=adapters.wrap(layer.output, "output", index),
                gate_up=adapters.wrap(layer.gate_up, "gate_up", index), down=adapters.wrap(layer.down, "down", index))
        return
    decoder_layers = forward_pass.decoder.layers
    for index, block in enumerate(decoder_layers):
        block.qkv.linear = adapters.wrap(block.qkv.linear, "qkv", index)
        block.mlp.gate_up = adapters.wrap(block.mlp.gate_up, "gate_up", index)
        block.mlp.down = adapters.wrap(block.mlp.down, "down", index)
        decoder_layers[index] = dataclasses.replace(block, output=adapters.wrap(block.output, "output", index))
