"""What speculation does per step, in the engine alone (no servers): tokens a step and a step's cost.

    python -m studies.speculation_steps --speculate 4 --max-new-tokens 128 --pairs 40

Part one runs each of `studies.speculation`'s input-grounded chat prompts alone through the paged
engine with `--speculate N` and counts its tokens, steps, proposed and accepted tokens (greedy: the
same on any machine). Part two times one request's step after a 300-token prompt, alternately a
1-token decode and its last token plus N proposals (drafts set by hand, the rest of the step the
engine's own), and gives the medians and their ratio. With `--draft-model-id` part one counts for
the draft model too, times the draft's proposing and its verifying step after part two's, and part
three times each prompt's whole request in the engine with speculation off, prompt lookup and the
draft, taking turns (the order rotated every repeat), and gives each one's median output tokens/s.
The embedded SmolLM2 in float32 on CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from studies.speculation import GROUNDED
from ztgi.common.messages import SamplingParameters, WorkerRequest
from ztgi.common.model_source import resolve_model
from ztgi.services.worker.model_loader import load_paged_model


def one_request(model: Any, request_id: int, input_ids: list[int], max_new_tokens: int,
                ignore_eos: bool = False) -> Any:
    """A one-request batch with blocks for all its tokens."""
    num_blocks = -(-(len(input_ids) + max_new_tokens) // model.block_size)
    request = WorkerRequest(request_id, input_ids, SamplingParameters(), max_new_tokens, ignore_eos,
                            block_ids=list(range(num_blocks)))
    return model.batch_type.from_requests([request], request_id, len(input_ids) + max_new_tokens, model)


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
    return tokenizer(prompt)["input_ids"]


def run_request(model: Any, request_id: int, input_ids: list[int],
                max_new_tokens: int) -> tuple[list[int], int, int, int]:
    """One greedy request to its end: its tokens, steps, proposed and accepted tokens."""
    batch = one_request(model, request_id, input_ids, max_new_tokens)
    token_ids: list[int] = []
    num_steps = num_proposed = num_accepted = 0
    while batch is not None:
        generations, batch, timings = model.generate_token(batch)
        token_ids += [generation.token_id for generation in generations]
        num_steps += 1
        num_proposed, num_accepted = num_proposed + timings.num_proposed, num_accepted + timings.num_accepted
    return token_ids, num_steps, num_proposed, num_accepted


def count_steps(model: Any, tokenizer: Any, max_new_tokens: int) -> None:
    for number, (name, text) in enumerate(GROUNDED.items(), 1):
        token_ids, num_steps, num_proposed, num_accepted = run_request(model, number, chat_ids(tokenizer, text),
                                                                       max_new_tokens)
        num_tokens = len(token_ids)
        print(f"{name:10s} {num_tokens} tokens in {num_steps} steps ({(num_tokens - 1) / (num_steps - 1):.2f} a "
              f"decoding step); {num_accepted} of {num_proposed} proposed tokens accepted", flush=True)


def time_requests(models: dict[str, Any], tokenizer: Any, max_new_tokens: int, repeats: int) -> None:
    """Each prompt's request run by every model in turn (rotated each repeat, the first round not
    counted): median output tokens/s, and whether the tokens were the same."""
    names = list(models)
    for name, text in GROUNDED.items():
        input_ids = chat_ids(tokenizer, text)
        rates: dict[str, list[float]] = {system: [] for system in names}
        outputs = set()
        for repeat in range(repeats + 1):
            for system in names[repeat % len(names):] + names[:repeat % len(names)]:
                started = time.perf_counter()
                token_ids, _, _, _ = run_request(models[system], 1, input_ids, max_new_tokens)
                if repeat:
                    rates[system].append(len(token_ids) / (time.perf_counter() - started))
                outputs.add(tuple(token_ids))
        medians = {system: statistics.median(values) for system, values in rates.items()}
        cells = [f"{system} {medians[system]:6.1f} tok/s ({medians[system] / medians['off']:.2f}x; runs "
                 f"{', '.join(f'{rate:.1f}' for rate in rates[system])})" for system in names]
        print(f"{name:10s} " + "  ".join(cells) + f"  same tokens: {len(outputs) == 1}", flush=True)


def time_steps(model: Any, num_speculative: int, num_pairs: int) -> None:
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


def time_proposals(model: Any, num_speculative: int, num_pairs: int) -> None:
    """The draft model's proposing (catch-up and N - 1 one-token forwards) and the verifying step
    that follows, one request after a 300-token prompt: medians."""
    batch = one_request(model, 100, list(range(1000, 1300)), 4 * num_pairs * (num_speculative + 1), True)
    model.generate_token(batch)  # the prefill (the draft runs the prompt too)
    proposing, verifying = [], []
    for _ in range(num_pairs):
        started = time.perf_counter()
        model.speculator.propose(batch)
        proposed = time.perf_counter()
        model.step(batch, time.perf_counter_ns())
        proposing.append(proposed - started)
        verifying.append(time.perf_counter() - proposed)
    print(f"draft model: proposing {num_speculative} tokens {statistics.median(proposing) * 1000:.1f} ms, the "
          f"verifying step {statistics.median(verifying) * 1000:.1f} ms", flush=True)


TINY_RANDOM = "tiny-random"


def tiny_random_draft() -> str:
    """A 1-layer random Llama of SmolLM2's vocabulary (hidden size 32) in a temporary directory: a
    draft whose compute is next to nothing, so its proposing time is the mechanism's own cost."""
    import tempfile

    from transformers import LlamaConfig, LlamaForCausalLM

    directory = tempfile.mkdtemp(prefix="tiny-draft-")
    torch.manual_seed(1)
    LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
                     ).save_pretrained(directory)
    return directory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speculate", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--draft-model-id", help=f"also count and time proposals by this draft model "
                        f"({TINY_RANDOM}: a random one of next to no compute, built here)")
    parser.add_argument("--repeats", type=int, default=3, help="part three (with a draft): rounds of requests")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    source = resolve_model()
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    model = load_paged_model(source.path, dtype="float32", device="cpu", speculate=args.speculate)
    model.allocate_pool(1024)
    count_steps(model, tokenizer, args.max_new_tokens)
    if args.draft_model_id:
        draft_model_id = tiny_random_draft() if args.draft_model_id == TINY_RANDOM else args.draft_model_id
        drafted = load_paged_model(source.path, dtype="float32", device="cpu", speculate=args.speculate,
                                   draft_model_id=draft_model_id)
        drafted.allocate_pool(1024)
        print(f"with the draft model {args.draft_model_id}:", flush=True)
        count_steps(drafted, tokenizer, args.max_new_tokens)
    time_steps(model, args.speculate, args.pairs)
    if args.draft_model_id:
        time_proposals(drafted, args.speculate, args.pairs)
        off = load_paged_model(source.path, dtype="float32", device="cpu")
        off.allocate_pool(1024)
        time_requests({"off": off, "lookup": model, "draft": drafted}, tokenizer, args.max_new_tokens, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
