"""The collectives a sharded forward adds to the rank's own products (Megatron's pattern).

Column-parallel products (q/k/v, gate/up) need none: each rank computes its own heads and
intermediate rows. The row-parallel ones (attention output, down) each end in one all-reduce of
their partial sums; the vocabulary-parallel embedding in one all-reduce (each token's row comes
from the one rank that holds it, zeros from the others); the head in one all-gather of the ranks'
logits. Every rank ends each product with the same tensor, so every rank samples the same tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ztgi.services.worker.models.decoder import PagedDecoderForward
from ztgi.services.worker.models.llama import PagedLlamaForward
from ztgi.services.worker.shards.shard_group import ShardGroup
from ztgi.services.worker.shards.shard_plan import ShardPlan

Product = Callable[[torch.Tensor], torch.Tensor]


class RowParallel:
    """A product over the rank's input columns, summed over the ranks."""

    def __init__(self, local: Product, group: ShardGroup) -> None:
        self.local = local
        self.group = group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.local(x).contiguous())


class VocabParallelEmbedding:
    """Rows of the rank's vocabulary range; ids outside it give zeros; summed over the ranks."""

    def __init__(self, local: Product, group: ShardGroup, vocab: slice) -> None:
        self.local = local
        self.group = group
        self.start, self.stop = vocab.start, vocab.stop

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        outside = (input_ids < self.start) | (input_ids >= self.stop)
        rows = self.local(torch.where(outside, 0, input_ids - self.start))
        rows = rows.masked_fill(outside.unsqueeze(-1), 0)
        return self.group.all_reduce(rows.contiguous())


class GatheredHead:
    """The rank's logits (its vocabulary range) gathered into the whole vocabulary's."""

    def __init__(self, local: Product, group: ShardGroup, vocab_size: int) -> None:
        self.local = local
        self.group = group
        self.vocab_size = vocab_size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.group.all_gather_last(self.local(x))
        return logits[..., :self.vocab_size] if logits.shape[-1] != self.vocab_size else logits


def parallelize(forward_pass: PagedLlamaForward | PagedDecoderForward, group: ShardGroup, plan: ShardPlan) -> None:
    """Puts the collectives around the products of a forward built from a sharded module."""
    vocab_size = plan.sizes.vocab_size
    if isinstance(forward_pass, PagedLlamaForward):
        w = forward_pass.weights
        w.embed = VocabParallelEmbedding(w.embed, group, plan.vocab)
        w.lm_head = GatheredHead(w.lm_head, group, vocab_size)
        w.layers = [dataclasses.replace(layer, output=RowParallel(layer.output, group),
                                        down=RowParallel(layer.down, group)) for layer in w.layers]
        forward_pass.stack = None  # the one-call decode stack has no place for a collective
        return
    d = forward_pass.decoder
    for layer in d.layers:
        layer.mlp.down = RowParallel(layer.mlp.down, group)
    forward_pass.decoder = dataclasses.replace(
        d, embedding=VocabParallelEmbedding(d.embedding, group, plan.vocab),
        lm_head=GatheredHead(d.lm_head, group, vocab_size),
        layers=[dataclasses.replace(layer, output=RowParallel(layer.output, group)) for layer in d.layers])
