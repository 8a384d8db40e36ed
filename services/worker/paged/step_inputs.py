"""One paged step's flat inputs: which tokens run, where their keys go, which logits are needed."""

from __future__ import annotations

import dataclasses

import torch

from ztgi.services.worker.layers.attention import AttentionInputs, PrefillSpan, decode_groups
from ztgi.services.worker.layers.host_copy import to_device
from ztgi.services.worker.layers.kv_pool import KVPool
from ztgi.services.worker.paged.batch import PagedBatch, Sequence
from ztgi.services.worker.paged.pooler import Pooler


@dataclasses.dataclass(frozen=True)
class Entry:
    """Sequence `index` feeds its tokens `[start, start + count)` at rows `[row, row + count)`."""

    index: int
    start: int
    count: int
    row: int


@dataclasses.dataclass(frozen=True)
class StepInputs:
    entries: list[Entry]
    input_ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens], or [3, tokens] where a sequence has multimodal rotary positions (Qwen2-VL)
    attention: AttentionInputs
    logit_rows: torch.Tensor  # [logits]: the rows whose logits the step needs
    sampled: list[int]  # sequences that choose a token this step (their input is all computed)
    sample_logits: list[int]  # for each of `sampled`, its (first) row in the logits
    logprob_logits: dict[int, int]  # sequence -> first logit of its chunk (prefill logprobs asked)
    hidden_rows: torch.Tensor | None = None  # [pooled]: rows whose final hidden states embeddings pool
    pooled: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)  # (sequence, first, count) of those

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def build_step_inputs(batch: PagedBatch, pool: KVPool, pooler: Pooler | None = None) -> StepInputs | None:
    """The step's inputs, decodes first; None when no sequence has anything to run; with a
    `pooler`, the rows embedding requests pool. ValueError
    (nothing changed) when a sequence's blocks cannot hold its tokens or are not in the pool.
    Every per-token list is built in Python and becomes a tensor in one call: a few small tensor
    ops per sequence would cost more than the lists."""
    block_size, device = pool.block_size, pool.keys[0].device
    decodes, prefills = _planned(batch, block_size, pool.num_blocks)
    if not decodes and not prefills:
        return None
    sequences = batch.sequences
    entries: list[Entry] = []
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    for index, start, count in decodes + prefills:
        sequence = sequences[index]
        pool.prepare(sequence.block_ids)
        entries.append(Entry(index, start, count, len(input_ids)))
        input_ids.extend(sequence.step_tokens(start, count))
        positions.extend(range(start, start + count))
        slots.extend(_slots(sequence.block_ids, start, count, block_size))
    attention = _attention_inputs(sequences, entries[:len(decodes)], entries[len(decodes):],
                                  _int64(slots, device), block_size, device)
    logit_rows, sampled, sample_logits, logprob_logits = _logit_rows(sequences, entries)
    hidden_rows, pooled = _hidden_rows(sequences, entries, pooler) if pooler is not None else ([], [])
    step_positions: list[int] | list[list[int]] = positions
    if any(sequences[e.index].images is not None for e in entries):
        step_positions = _mrope_positions(sequences, entries, positions)
    return StepInputs(
        entries=entries, input_ids=_int64(input_ids, device), positions=_int64(step_positions, device),
        attention=attention, logit_rows=_int64(logit_rows, device),
        sampled=sampled, sample_logits=sample_logits, logprob_logits=logprob_logits,
        hidden_rows=_int64(hidden_rows, device) if hidden_rows else None, pooled=pooled)


def _mrope_positions(sequences: list[Sequence], entries: list[Entry], flat: list[int]) -> list[list[int]] | list[int]:
    """`[3, tokens]` where a sequence's images give it multimodal rotary positions (the others'
    positions in all three), else `flat` as it is."""
    ropes = [(e, rope) for e in entries if (images := sequences[e.index].images) is not None
             and (rope := images.rope) is not None]
    if not ropes:
        return flat
    rows = [list(flat), list(flat), list(flat)]
    for e, rope in ropes:
        for row, values in zip(rows, rope.positions(e.start, e.count)):
            row[e.row:e.row + e.count] = values
    return rows


def _hidden_rows(sequences: list[Sequence], entries: list[Entry],
                 pooler: Pooler) -> tuple[list[int], list[tuple[int, int, int]]]:
    rows: list[int] = []
    pooled: list[tuple[int, int, int]] = []
    for e in entries:
        wanted = pooler.rows(sequences[e.index], e.start, e.count, e.row)
        if wanted:
            pooled.append((e.index, len(rows), len(wanted)))
            rows.extend(wanted)
    return rows, pooled


def _int64(values: list[int] | list[list[int]], device: torch.device) -> torch.Tensor:
    return to_device(torch.tensor(values, dtype=torch.int64), device)


def _planned(batch: PagedBatch, block_size: int,
             num_blocks: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    decodes: list[tuple[int, int, int]] = []
    prefills: list[tuple[int, int, int]] = []
    for index, sequence in enumerate(batch.sequences):
        start, count = sequence.next_span()
        if count == 0:
            continue
        _check_blocks(sequence, start + count, block_size, num_blocks)
        # a draft is verified like a prefill chunk: causal over itself, after the cached keys
        (prefills if sequence.is_prefilling or sequence.draft else decodes).append((index, start, count))
    decodes.sort(key=lambda entry: entry[1])  # by context length: groups of similar lengths
    return decodes, prefills


def _check_blocks(sequence: Sequence, needed: int, block_size: int, num_blocks: int) -> None:
    if sequence.capacity(block_size) < needed:
        raise ValueError(f"request {sequence.seq_id}: its {len(sequence.block_ids)} KV blocks hold "
                         f"{sequence.capacity(block_size)} tokens, the step needs {needed}")
    if sequence.block_ids and not 0 <= min(sequence.block_ids) <= max(sequence.block_ids) < num_blocks:
        raise ValueError(f"request {sequence.seq_id}: block ids must be in [0, {num_blocks}), "
                         f"got {sequence.block_ids}")


def _slots(block_ids: list[int], start: int, count: int, block_size: int) -> list[int]:
    """The pool slots of positions `[start, start + count)`, a block's run at a time."""
    slots: list[int] = []
    position, end = start, start + count
    while position < end:
        block, offset = divmod(position, block_size)
        take = min(block_size - offset, end - position)
        first = block_ids[block] * block_size + offset
        slots.extend(range(first, first + take))
        position += take
    return slots


def _attention_inputs(sequences: list[Sequence], decodes: list[Entry], prefills: list[Entry], slots: torch.Tensor,
                      block_size: int, device: torch.device) -> AttentionInputs:
    groups = []
    if decodes:
        tables = [sequences[e.index].block_ids[:e.start // block_size + 1] for e in decodes]
        groups = decode_groups(tables, [e.start + 1 for e in decodes], block_size, device)
    spans = [PrefillSpan(e.row, e.row + e.count, e.start,
                         _int64(sequences[e.index].block_ids[:-(-(e.start + e.count) // block_size)], device))
             for e in prefills]
    return AttentionInputs(slots, groups, spans)


def _logit_rows(sequences: list[Sequence],
                entries: list[Entry]) -> tuple[list[int], list[int], list[int], dict[int, int]]:
    rows: list[int] = []
    sampled, sample_logits, logprob_logits = [], [], {}
    for e in entries:
        sequence = sequences[e.index]
        completes = e.start + e.count == len(sequence.tokens)
        if sequence.prefill_logprobs is not None and sequence.is_prefilling:
            logprob_logits[e.index] = len(rows)
            rows.extend(range(e.row, e.row + e.count))
            if completes:
                sampled.append(e.index)
                sample_logits.append(len(rows) - 1)
        elif sequence.draft:  # every position's logits: the last chosen token's and each proposal's
            sampled.append(e.index)
            sample_logits.append(len(rows))
            rows.extend(range(e.row, e.row + e.count))
        elif completes:
            sampled.append(e.index)
            sample_logits.append(len(rows))
            rows.append(e.row + e.count - 1)
    return rows, sampled, sample_logits, logprob_logits
