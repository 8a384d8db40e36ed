"""What speculation does per step, in the engine alone (no servers): tokens a step and a step's cost.

    python -m benchmarks.speculation_steps --speculate 4 --max-new-tokens 128 --pairs 40

Part one runs each of `benchmarks.speculation`'s input-grounded chat prompts alone through the
paged engine with `--speculate N` and counts its tokens, steps, proposed and accepted tokens (greedy:
the same on any machine). Part two times one request's step after a 300-token prompt, alternately
a 1-token decode and its last token plus N proposals (drafts set by hand, the rest of the step the
engine's own), and gives the medians and their ratio. The embedded SmolLM2 in float32 on CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import torch

from benchmarks.speculation import GROUNDED
from common.messages import SamplingParameters, WorkerRequest
from common.model_source import resolve_model
from services.worker.backend import load_paged_model


def one_request(model, request_id: int, input_ids: list[int], max_new_tokens: int, ignore_eos: bool = False):
    """A one-request batch with blocks for all its tokens."""
    num_blocks = -(-(len(input_ids) + max_new_tokens) // model.block_size)
    request = WorkerRequest(request_id, input_ids, SamplingParameters(), max_new_tokens, ignore_eos,
                            block_ids=list(range(num_blocks)))
    return model.batch_type.from_requests([request], request_id, len(input_ids) + max_new_tokens, model)


def count_steps(model, tokenizer, max_new_tokens: int) -> None:
    for number, (name, text) in enumerate(GROUNDED.items(), 1):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=False)
        batch = one_request(model, number, tokenizer(prompt)["input_ids"], max_new_tokens)
        num_tokens = num_steps = num_proposed = num_accepted = 0
        while batch is not None:
            generations, batch, timings = model.generate_token(batch)
            num_steps, num_tokens = num_steps + 1, num_tokens + len(generations)
            num_proposed, num_accepted = num_proposed + timings.num_proposed, num_accepted + timings.num_accepted
        print(f"{name:10s} {num_tokens} tokens in {num_steps} steps ({(num_tokens - 1) / (num_steps - 1):.2f} a "
              f"decoding step); {num_accepted} of {num_proposed} proposed tokens accepted", flush=True)


def time_steps(model, num_speculative: int, num_pairs: int) -> None:
    batch = one_request(model, 100, list(range(1000, 1300)), 4 * num_pairs * (num_speculative + 1), True)
    model.step(batch, time.perf_counter_ns())  # the prefill
    sequence = batch.sequences[0]
    times: dict[int, list[float]] = {1: [], num_speculative + 1: []}
    for _ in range(num_pairs):
        for width in times:
            sequence.draft = [7] * (width - 1)
            started = time.perf_counter()
            model.step(batch, time.perf_counter_ns())
            times[width].append(time.perf_counter() - started)
    medians = {width: statistics.median(values) * 1000 for width, values in times.items()}
    print(f"step of 1 token: {medians[1]:.1f} ms; of 1 + {num_speculative}: {medians[num_speculative + 1]:.1f} ms "
          f"({medians[num_speculative + 1] / medians[1]:.2f}x)", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speculate", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    source = resolve_model()
    model = load_paged_model(source.path, dtype="float32", device="cpu", speculate=args.speculate)
    model.allocate_pool(1024)
    count_steps(model, AutoTokenizer.from_pretrained(source.path), args.max_new_tokens)
    time_steps(model, args.speculate, args.pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
