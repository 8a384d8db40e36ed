"""A padded batch of requests and its KV cache (TGI's CausalLMBatch).

Layout: every row is left-padded to `max_input_length` (the longest sequence so far, including
the token fed at the next step), followed by `padding_right_offset` columns reserved for tokens
still to come (always exactly `max_input_length + padding_right_offset` columns). The attention
mask and `token_ids` (every token so far, for penalties) share this layout; each step fills one
more column. The KV cache holds `max_input_length - 1` live positions per layer after every step
(the same columns as the mask). Filter drops rows (moving as few KV rows as it can) and trims
padding nobody needs any more; concatenate re-pads every batch to the longest one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ztgi.common.messages import CachedBatch, SeqUpdate, WorkerRequest
from ztgi.services.worker.models.request_checks import BatchModel, chooser_for, require_unique, validate_requests
from ztgi.services.worker.padded.kv_cache import KVCache, swap_remove_order
from ztgi.services.worker.sampling.next_token_chooser import NextTokenChooser
from ztgi.services.worker.sampling.stopping_criteria import StoppingCriteria


@dataclasses.dataclass(eq=False)
class CausalLMBatch:
    """Requests stepped together, their tensors on the model's device, and per-request state."""

    batch_id: int
    requests: list[WorkerRequest]
    seq_id_to_index: dict[int, int]
    input_ids: torch.Tensor  # [batch, max_input_length] before prefill, [batch, 1] after
    position_ids: torch.Tensor  # same shape as input_ids
    attention_mask: torch.Tensor  # [batch, max_input_length + padding_right_offset]
    token_ids: torch.Tensor  # same layout as attention_mask
    kv_cache: KVCache | None
    input_lengths: list[int]
    stopping_criteria: list[StoppingCriteria]
    chooser: NextTokenChooser
    top_n_tokens: list[int]
    max_input_length: int
    padding_right_offset: int
    max_tokens: int

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def seq_ids(self) -> list[int]:
        return [r.seq_id for r in self.requests]

    @property
    def all_stopped(self) -> bool:
        return all(s.stopped for s in self.stopping_criteria)

    def to_cached(self) -> CachedBatch:
        return CachedBatch(self.batch_id, self.seq_ids, self.max_tokens)

    def apply(self, updates: Sequence[SeqUpdate]) -> None:
        """Paged workers take block tables and prefill chunks with each step; a padded batch none."""
        if updates:
            raise ValueError("block updates sent to a worker whose KV cache is padded")

    # -- prefill -------------------------------------------------------------------------------

    @classmethod
    def from_requests(cls, requests: Sequence[WorkerRequest], batch_id: int, max_tokens: int,
                      model: BatchModel) -> CausalLMBatch:
        """A batch ready for prefill; raises ValueError naming a bad request and field."""
        validate_requests(requests, batch_id, model)
        for request in requests:
            if request.adapter is not None:
                raise ValueError(f"request {request.seq_id}: this worker (--kv-cache padded) serves no LoRA adapters")
            if request.images:
                raise ValueError(f"request {request.seq_id}: this worker (--kv-cache padded) takes no images")
        chooser = chooser_for(requests, model.device, model.vocab_size)
        lengths = [len(r.input_ids) for r in requests]
        max_input_length = max(lengths)
        padding_right_offset = max(r.max_new_tokens for r in requests)
        token_ids, attention_mask = _left_padded(requests, max_input_length, padding_right_offset)
        position_ids = (attention_mask[:, :max_input_length].cumsum(-1) - 1).clamp_min(0)
        device = model.device
        return cls(
            batch_id=batch_id,
            requests=list(requests),
            seq_id_to_index={r.seq_id: i for i, r in enumerate(requests)},
            input_ids=token_ids[:, :max_input_length].to(device),
            position_ids=position_ids.to(device),
            attention_mask=attention_mask.to(device),
            token_ids=token_ids.to(device),
            kv_cache=None,
            input_lengths=lengths,
            stopping_criteria=[StoppingCriteria(model.eos_token_ids, r.max_new_tokens, r.ignore_eos)
                                for r in requests],
            chooser=chooser,
            top_n_tokens=[r.top_n_tokens for r in requests],
            max_input_length=max_input_length,
            padding_right_offset=padding_right_offset,
            max_tokens=max_tokens,
        )

    # -- after a step --------------------------------------------------------------------------

    def advance(self, next_ids: torch.Tensor, kv_cache: KVCache) -> None:
        """Feeds `next_ids` `[batch]` at the next step: one more column of mask and tokens."""
        column = self.max_input_length
        self.input_ids = next_ids.unsqueeze(1)
        self.position_ids = self.position_ids[:, -1:] + 1
        self.attention_mask[:, column] = 1
        self.token_ids[:, column] = next_ids
        self.kv_cache = kv_cache
        self.input_lengths = [n + 1 for n in self.input_lengths]
        self.max_input_length += 1
        self.padding_right_offset -= 1

    @property
    def forward_attention_mask(self) -> torch.Tensor:
        """The mask over the cached positions plus the ones fed now."""
        return self.attention_mask[:, :self.max_input_length]

    def token_history(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's tokens so far and their mask (for penalties)."""
        return self.token_ids[:, :self.max_input_length], self.attention_mask[:, :self.max_input_length]

    # -- filter --------------------------------------------------------------------------------

    @torch.inference_mode()
    def filter(self, seq_ids: Sequence[int]) -> CausalLMBatch | None:
        """The batch keeping only `seq_ids`; None when the list is empty.

        Rows are reordered as moving the fewest KV rows requires (`swap_remove_order`):
        `seq_ids` of the result (and its CachedBatch) give the new order. The KV cache is
        filtered in place, so `self` must not be stepped afterwards. Raises ValueError for an id
        that is not in the batch, and then `self` is left as it was.
        """
        if not seq_ids:
            return None
        require_unique(seq_ids)
        missing = [rid for rid in seq_ids if rid not in self.seq_id_to_index]
        if missing:
            raise ValueError(f"requests {missing} are not in batch {self.batch_id}")
        if sorted(seq_ids) == sorted(self.seq_ids):
            return self
        if self.kv_cache is None:
            raise ValueError(f"batch {self.batch_id} was never prefilled: nothing to filter")
        kept = [self.seq_id_to_index[rid] for rid in seq_ids]
        return self._select(swap_remove_order(len(self), kept), self.kv_cache)

    def _select(self, indices: list[int], kv_cache: KVCache) -> CausalLMBatch:
        stopping = [self.stopping_criteria[i] for i in indices]
        input_lengths = [self.input_lengths[i] for i in indices]
        max_input_length = max(input_lengths)
        padding_right_offset = max(s.num_remaining for s in stopping)
        # columns: keep the last `max_input_length` used ones and the room the kept rows still need
        start = self.max_input_length - max_input_length
        end = self.max_input_length + padding_right_offset
        rows = torch.tensor(indices, device=self.input_ids.device)
        requests = [self.requests[i] for i in indices]
        return dataclasses.replace(
            self,
            requests=requests,
            seq_id_to_index={r.seq_id: i for i, r in enumerate(requests)},
            input_ids=self.input_ids[rows],
            position_ids=self.position_ids[rows],
            attention_mask=self.attention_mask[rows, start:end],
            token_ids=self.token_ids[rows, start:end],
            kv_cache=kv_cache.select(indices, max_input_length - 1),
            input_lengths=input_lengths,
            stopping_criteria=stopping,
            chooser=self.chooser.select(indices),
            top_n_tokens=[self.top_n_tokens[i] for i in indices],
            max_input_length=max_input_length,
            padding_right_offset=padding_right_offset,
            max_tokens=len(indices) * max_input_length + sum(s.num_remaining for s in stopping),
        )

    # -- concatenate ---------------------------------------------------------------------------

    @classmethod
    @torch.inference_mode()
    def concatenate(cls, batches: Sequence[CausalLMBatch]) -> CausalLMBatch:
        """One batch of all requests, under the first batch's id; the inputs are left as they were."""
        if len(batches) == 1:
            return batches[0]
        kv_caches = [b.kv_cache for b in batches if b.kv_cache is not None]
        if len(kv_caches) < len(batches):
            raise ValueError("only prefilled batches can be concatenated")
        require_unique([rid for b in batches for rid in b.seq_ids])
        max_input_length = max(b.max_input_length for b in batches)
        padding_right_offset = max(b.padding_right_offset for b in batches)
        requests = [r for b in batches for r in b.requests]
        return cls(
            batch_id=batches[0].batch_id,
            requests=requests,
            seq_id_to_index={r.seq_id: i for i, r in enumerate(requests)},
            input_ids=torch.cat([b.input_ids for b in batches]),
            position_ids=torch.cat([b.position_ids for b in batches]),
            attention_mask=_pad_columns([b.live_columns(b.attention_mask) for b in batches],
                                        max_input_length, padding_right_offset),
            token_ids=_pad_columns([b.live_columns(b.token_ids) for b in batches],
                                   max_input_length, padding_right_offset),
            kv_cache=KVCache.concatenate(kv_caches, max_input_length - 1,
                                     max_input_length + padding_right_offset),
            input_lengths=[n for b in batches for n in b.input_lengths],
            stopping_criteria=[s for b in batches for s in b.stopping_criteria],
            chooser=NextTokenChooser.concatenate([b.chooser for b in batches]),
            top_n_tokens=[n for b in batches for n in b.top_n_tokens],
            max_input_length=max_input_length,
            padding_right_offset=padding_right_offset,
            max_tokens=sum(b.max_tokens + (max_input_length - b.max_input_length) * len(b) for b in batches),
        )

    def live_columns(self, tensor: torch.Tensor) -> torch.Tensor:
        """The used columns of a mask-layout tensor (the room for tokens to come left out)."""
        return tensor[:, :self.max_input_length]

def _left_padded(requests: Sequence[WorkerRequest], max_input_length: int,
                 padding_right_offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask, on the host, each prompt right-aligned at `max_input_length`."""
    token_ids = torch.zeros((len(requests), max_input_length + padding_right_offset), dtype=torch.int64)
    attention_mask = torch.zeros_like(token_ids)
    for i, request in enumerate(requests):
        start = max_input_length - len(request.input_ids)
        token_ids[i, start:max_input_length] = torch.tensor(request.input_ids)
        attention_mask[i, start:max_input_length] = 1
    return token_ids, attention_mask


def _pad_columns(parts: list[torch.Tensor], max_input_length: int, padding_right_offset: int) -> torch.Tensor:
    """Stacks left-padded `[rows, length]` parts right-aligned at `max_input_length`, with room after."""
    total_rows = sum(p.shape[0] for p in parts)
    out = parts[0].new_zeros((total_rows, max_input_length + padding_right_offset))
    start = 0
    for part in parts:
        rows, length = part.shape
        out[start:start + rows, max_input_length - length:max_input_length] = part
        start += rows
    return out
