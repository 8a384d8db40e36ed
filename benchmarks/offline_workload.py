"""The workload of the in-process baselines: `ztgi bench`'s prompts, as the token ids ztgi serves.

Every system of a comparison runs the same list: the same prompts in the same order, the same
`max_new_tokens`, and the ids ztgi's tokenizer would make of a TGI `inputs` string
(`encode(text, add_special_tokens=True)`, no chat template).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from ztgi.bench.config import BenchConfig
from ztgi.bench.workload import Prompt, build_workload


@dataclasses.dataclass(frozen=True)
class OfflineRequest:
    """One request of the workload, already encoded."""

    request_id: int
    input_ids: list[int]
    max_new_tokens: int


def load_prompts(dataset: str, output_tokens: int | None = None, max_requests: int | None = None) -> list[Prompt]:
    """The first `max_requests` prompts of `dataset` (`mixed` or a JSONL path), as `ztgi bench` reads them."""
    prompts = build_workload(BenchConfig(dataset=dataset, output_tokens=output_tokens))
    return prompts[:max_requests] if max_requests else prompts


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt]) -> list[OfflineRequest]:
    """The prompts as ztgi's tokenizer encodes a TGI `inputs` string."""
    return [OfflineRequest(request_id, tokenizer.encode(prompt.text, add_special_tokens=True), prompt.max_new_tokens)
            for request_id, prompt in enumerate(prompts)]
