"""The worker's engine in-process on SmolLM2: the first token of a shared-prefix question computed
whole, against the same question over the cached document (`cache_len`), in alternating turns
(A B A B) so drift in machine speed cancels; and the greedy tokens of both, which must match.
`python -m studies.prefix_prefill [--repeats N] [--threads T] [--new-tokens K]`."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from ztgi.bench.workload import BUILT_IN_DATASETS
from ztgi.common.messages import SamplingParameters, WorkerRequest
from ztgi.services.tokenizer.loading import load_tokenizer
from ztgi.services.worker.model_loader import load_paged_model
from ztgi.services.worker.paged.batch import PagedBatch


def _prompts(tokenizer: Any, count: int) -> list[list[int]]:
    with open(BUILT_IN_DATASETS["shared-prefix"], encoding="utf-8") as file:
        return [tokenizer(json.loads(line)["prompt"])["input_ids"] for line in file.readlines()[:count]]


def _generate(model: Any, tokens: list[int], cache_len: int, num_new: int, request_id: int) -> tuple[float, list[int]]:
    """Seconds to the first token, and the greedy tokens; blocks 0.. hold the document."""
    blocks = list(range(-(-(len(tokens) + num_new) // model.block_size)))
    request = WorkerRequest(request_id, tokens, SamplingParameters(), max_new_tokens=num_new, ignore_eos=True,
                            block_ids=blocks, cache_len=cache_len)
    batch = PagedBatch.from_requests([request], request_id, len(tokens) + num_new, model)
    started = time.perf_counter()
    generations, batch, _ = model.generate_token(batch)
    first_s, ids = time.perf_counter() - started, [g.token_id for g in generations]
    while batch is not None:
        generations, batch, _ = model.generate_token(batch)
        ids += [g.token_id for g in generations]
    return first_s, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_paged_model("smollm2", dtype="float32", device="cpu")
    model.allocate_pool(256)
    document, *questions = _prompts(load_tokenizer("smollm2"), args.repeats + 1)
    shared = next(i for i, (a, b) in enumerate(zip(document, questions[0])) if a != b)
    cache_len = shared // model.block_size * model.block_size
    _generate(model, document, 0, 1, 0)  # fills blocks 0.. with the document's keys and values
    whole, cached, same = [], [], 0
    for i, question in enumerate(questions):
        cached_s, cached_ids = _generate(model, question, cache_len, args.new_tokens, 2 * i + 1)
        whole_s, whole_ids = _generate(model, question, 0, args.new_tokens, 2 * i + 2)
        _generate(model, document, 0, 1, 0)  # the document's blocks again (the whole run rewrote them)
        whole.append(whole_s)
        cached.append(cached_s)
        same += cached_ids == whole_ids
    print(f"prompt {len(questions[0])} tokens, {cache_len} cached; {args.threads} thread(s), {args.repeats} pairs")
    print(f"first token, whole prompt: median {statistics.median(whole) * 1e3:.0f} ms  "
          f"{[round(s * 1e3) for s in whole]}")
    print(f"first token, cached prefix: median {statistics.median(cached) * 1e3:.0f} ms  "
          f"{[round(s * 1e3) for s in cached]}")
    print(f"ratio {statistics.median(whole) / statistics.median(cached):.1f}x; same greedy tokens in {same} of "
          f"{len(questions)} pairs")


if __name__ == "__main__":
    main()
