"""The built-in datasets' writers: what they write is what the bench tool ships."""

from __future__ import annotations

import os
import random

from tokenizers import Tokenizer

from studies.prefill_heavy_dataset import MAX_PROMPT_TOKENS, MIN_PROMPT_TOKENS, prefill_heavy
from ztgi.bench.config import BenchConfig
from ztgi.bench.workload import build_workload
from ztgi.common.model_source import ModelSource


def test_prefill_heavy_set_is_the_committed_file_and_spans_its_lengths(smollm2: ModelSource) -> None:
    """The committed file is what its generator writes; its prompts are distinct chat turns of 20 to
    740 tokens in SmolLM2's tokenizer (within a few tokens), spread over the range, whose first
    tokens differ after the turn's opening (no shared prefix for a cache to reuse)."""
    prompts = build_workload(BenchConfig(dataset="prefill-heavy"))
    assert [{"prompt": p.text, "max_new_tokens": p.max_new_tokens} for p in prompts] == prefill_heavy(random.Random(23))
    tokenizer = Tokenizer.from_file(os.path.join(smollm2.path, "tokenizer.json"))
    ids = [tokenizer.encode(p.text, add_special_tokens=False).ids for p in prompts]
    lengths = sorted(len(i) for i in ids)
    assert len(prompts) == 64 and len({p.text for p in prompts}) == 64
    assert abs(lengths[0] - MIN_PROMPT_TOKENS) <= 4 and abs(lengths[-1] - MAX_PROMPT_TOKENS) <= 4
    assert sum(lengths) / len(lengths) > 300  # spread, not bunched at either end
    assert len({tuple(i[:8]) for i in ids}) == 64
