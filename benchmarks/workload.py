"""The workload: prompts from a JSONL dataset, the built-in mixed set, or generated from words."""

from __future__ import annotations

import dataclasses
import json
import os
import random

from ztgi.bench.config import BenchConfig

MIXED_DATASET_PATH = os.path.join(os.path.dirname(__file__), "data", "mixed.jsonl")
# name -> file in benchmarks/data; prefill_heavy_dataset.py and prefix_datasets.py write all but `mixed`
BUILT_IN_DATASETS = {
    "mixed": MIXED_DATASET_PATH,
    "prefill-heavy": os.path.join(os.path.dirname(__file__), "data", "prefill_heavy.jsonl"),
    "shared-prefix": os.path.join(os.path.dirname(__file__), "data", "shared_prefix.jsonl"),
    "multi-turn": os.path.join(os.path.dirname(__file__), "data", "multi_turn.jsonl"),
}
DEFAULT_INPUT_TOKENS = 128
DEFAULT_OUTPUT_TOKENS = 128
DEFAULT_NUM_GENERATED = 100

# Common English words that are one token each, with or without a leading space, in SmolLM2's
# tokenizer (and in most BPE vocabularies): N words joined by spaces make an N-token prompt.
WORDS = tuple("""
the of and to in is was for that on as with by he at from his an were are which this be or has
had not but first one their its new after who they have her she two been other when there all
during into school time may years more most only over city some world would where later up such
used many can state about national out known university then made team also year three people
them because between both called these each against part well before area under while until home
found work through game same group since life being film series did any second four number death
long high day way water war night music season house north south east west place family left right
great small large young old end point line side name women men power back book story church early
late public field case lot company system program question government student river country head
road color light food body land money market party problem report room fact month order word level
office door health person art history law job plan result force center kind hand child eye face
mind car table paper love blue green red black white gold tree star wind rain snow fire stone glass
iron wood cloud voice dream heart dog cat bird fish horse forest ocean bridge castle tower window
letter picture song train ship plane street station doctor teacher king peace summer winter spring
today always never often happy quiet bright dark warm cold simple strong
""".split())


class WorkloadError(ValueError):
    """A dataset that cannot be read; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One request of the workload; `input_tokens` is the nominal length of a generated prompt."""

    text: str
    max_new_tokens: int
    input_tokens: int | None = None
    adapter: str | None = None  # the LoRA adapter it asks for (--lora-adapters); None: the base model


def build_workload(config: BenchConfig) -> list[Prompt]:
    """The prompts `config` asks for (the load generator cycles through them)."""
    if config.dataset is None:
        num_prompts = config.num_requests or DEFAULT_NUM_GENERATED
        return generate_prompts(num_prompts, config.input_tokens or DEFAULT_INPUT_TOKENS,
                                config.output_tokens or DEFAULT_OUTPUT_TOKENS,
                                config.input_tokens_range, config.seed)
    path = BUILT_IN_DATASETS.get(config.dataset, config.dataset)
    prompts = load_dataset(path)
    if config.output_tokens is not None:
        prompts = [dataclasses.replace(p, max_new_tokens=config.output_tokens) for p in prompts]
    return prompts


def generate_prompts(num_prompts: int, input_tokens: int, output_tokens: int,
                     input_tokens_range: float = 0.0, seed: int = 0) -> list[Prompt]:
    """`num_prompts` random word sequences, lengths uniform in input_tokens * (1 ± range)."""
    rng = random.Random(seed)
    low = max(1, round(input_tokens * (1.0 - input_tokens_range)))
    high = max(low, round(input_tokens * (1.0 + input_tokens_range)))
    prompts = []
    for _ in range(num_prompts):
        length = rng.randint(low, high)
        prompts.append(Prompt(" ".join(rng.choices(WORDS, k=length)), output_tokens, length))
    return prompts


def load_dataset(path: str) -> list[Prompt]:
    """Reads JSONL lines `{"prompt": str, "max_new_tokens": int}`; blank lines are skipped."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.readlines()
    except OSError as exc:
        raise WorkloadError(f"cannot read dataset {path!r}: {exc.strerror}") from None
    prompts = [_parse_line(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise WorkloadError(f"dataset {path!r} has no prompts")
    return prompts


def _parse_line(path: str, number: int, line: str) -> Prompt:
    where = f"{path}:{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise WorkloadError(f"{where}: expected an object with `prompt` and `max_new_tokens`")
    prompt, max_new_tokens = record.get("prompt"), record.get("max_new_tokens")
    if not isinstance(prompt, str) or not prompt:
        raise WorkloadError(f"{where}: `prompt` must be a non-empty string")
    if type(max_new_tokens) is not int or max_new_tokens < 1:
        raise WorkloadError(f"{where}: `max_new_tokens` must be an integer >= 1, got {max_new_tokens!r}")
    return Prompt(prompt, max_new_tokens)
