"""The workload: generated prompt lengths and determinism, JSONL datasets, the mixed and prefill-heavy sets."""

from __future__ import annotations

import json
import os

import pytest
from tokenizers import Tokenizer

from ztgi.bench.config import BenchConfig
from ztgi.bench.workload import MIXED_DATASET_PATH, WorkloadError, build_workload, generate_prompts, load_dataset
from ztgi.common.model_source import ModelSource


def test_generated_prompts_have_the_asked_length() -> None:
    """Without a range every prompt is exactly `input_tokens` words with the asked output length."""
    prompts = generate_prompts(20, input_tokens=50, output_tokens=7, seed=1)
    assert len(prompts) == 20
    assert all(len(p.text.split()) == p.input_tokens == 50 and p.max_new_tokens == 7 for p in prompts)
    assert len({p.text for p in prompts}) == 20  # distinct: no accidental prefix sharing


def test_generated_lengths_spread_within_the_range() -> None:
    """With range r lengths vary, all within [N(1-r), N(1+r)]."""
    lengths = [p.input_tokens for p in generate_prompts(200, 100, 8, input_tokens_range=0.5, seed=2)]
    assert min(lengths) >= 50 and max(lengths) <= 150
    assert len(set(lengths)) > 20


def test_generation_is_deterministic_per_seed() -> None:
    """The same seed gives the same prompts; another seed gives others."""
    assert generate_prompts(5, 30, 8, 0.2, seed=7) == generate_prompts(5, 30, 8, 0.2, seed=7)
    assert generate_prompts(5, 30, 8, 0.2, seed=7) != generate_prompts(5, 30, 8, 0.2, seed=8)


def test_one_word_is_one_token_in_smollm2(smollm2: ModelSource) -> None:
    """A generated N-word prompt is N tokens in SmolLM2's tokenizer."""
    tokenizer = Tokenizer.from_file(os.path.join(smollm2.path, "tokenizer.json"))
    for prompt in generate_prompts(10, 64, 8, input_tokens_range=0.5, seed=3):
        assert len(tokenizer.encode(prompt.text, add_special_tokens=False).ids) == prompt.input_tokens


def test_mixed_dataset_is_varied() -> None:
    """The built-in set: about 64 distinct prompts asking for 16 to 256 tokens."""
    prompts = load_dataset(MIXED_DATASET_PATH)
    assert len(prompts) == 64 and len({p.text for p in prompts}) == 64
    assert min(p.max_new_tokens for p in prompts) == 16 and max(p.max_new_tokens for p in prompts) == 256
    assert build_workload(BenchConfig(dataset="mixed")) == prompts


def test_output_tokens_overrides_the_dataset(tmp_path) -> None:
    """--output-tokens replaces every max_new_tokens of a dataset."""
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "a", "max_new_tokens": 5}) + "\n\n"
                    + json.dumps({"prompt": "b", "max_new_tokens": 6}) + "\n")
    prompts = build_workload(BenchConfig(dataset=str(path), output_tokens=9))
    assert [(p.text, p.max_new_tokens) for p in prompts] == [("a", 9), ("b", 9)]


@pytest.mark.parametrize("line, message", [
    ("{oops", "d.jsonl:2: not JSON"),
    ('["a"]', "d.jsonl:2: expected an object"),
    ('{"prompt": "", "max_new_tokens": 4}', "d.jsonl:2: `prompt` must be a non-empty string"),
    ('{"prompt": "x", "max_new_tokens": 0}', "d.jsonl:2: `max_new_tokens` must be an integer >= 1"),
    ('{"prompt": "x", "max_new_tokens": true}', "d.jsonl:2: `max_new_tokens` must be an integer >= 1"),
])
def test_bad_dataset_line_names_file_and_line(tmp_path, line: str, message: str) -> None:
    """A bad line is a WorkloadError naming the file, the line number and the problem."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "ok", "max_new_tokens": 4}\n' + line + "\n")
    with pytest.raises(WorkloadError, match=message.replace("[", r"\[")):
        load_dataset(str(path))


def test_missing_or_empty_dataset_is_a_clear_error(tmp_path) -> None:
    """A missing file and a file without prompts are WorkloadErrors naming the path."""
    with pytest.raises(WorkloadError, match="cannot read dataset .*nope.jsonl"):
        load_dataset(str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(WorkloadError, match="has no prompts"):
        load_dataset(str(tmp_path / "empty.jsonl"))
