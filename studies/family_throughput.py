"""A natively served family's paged forward against its transformers fallback (padded), in-process.

    python -m studies.family_throughput --model-type qwen2 --rounds 2

A random-weight model of `--model-type` with SmolLM2-135M's shape (hidden 576, 9 heads, 3 KV heads,
`--layers` layers) is saved once; each round runs the same batch (`--requests` prompts of
`--prompt-tokens` random ids, `--new-tokens` greedy tokens each, EOS ignored) to the end through
`--kv-cache paged` and then `--kv-cache padded --backend transformers`, on one thread, and prints
output tokens/s of each and their ratio per round (paired, as the machine's load moves). Greedy
ids of both are checked equal.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch

from ztgi.common.messages import SamplingParameters, WorkerRequest
from ztgi.services.worker.model_loader import load_padded_model, load_paged_model


def _save(model_type: str, layers: int, directory: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                  num_hidden_layers=layers, num_attention_heads=9, num_key_value_heads=3,
                                  head_dim=64, tie_word_embeddings=True, eos_token_id=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)


def _requests(args: argparse.Namespace, block_size: int) -> list[WorkerRequest]:
    generator = torch.Generator().manual_seed(1)
    per_request = -(-(args.prompt_tokens + args.new_tokens) // block_size)
    return [WorkerRequest(i, torch.randint(3, 40000, (args.prompt_tokens,), generator=generator).tolist(),
                          SamplingParameters(), args.new_tokens, True, 0, False,
                          list(range(i * per_request, (i + 1) * per_request)))
            for i in range(args.requests)]


def _run(model: Any, requests: list[WorkerRequest]) -> tuple[float, dict[int, list[int]]]:
    batch = model.batch_type.from_requests(requests, 1, 1 << 20, model)
    tokens: dict[int, list[int]] = {}
    started = time.perf_counter()
    while batch is not None:
        generations, batch, _ = model.generate_token(batch)
        for generation in generations:
            tokens.setdefault(generation.seq_id, []).append(generation.token_id)
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-type", default="qwen2")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as directory:
        _save(args.model_type, args.layers, directory)
        paged = load_paged_model(directory, dtype="float32", device="cpu", block_size=16)
        paged.allocate_pool(args.requests * -(-(args.prompt_tokens + args.new_tokens) // 16))
        padded = load_padded_model(directory, dtype="float32", device="cpu", backend="transformers")
        requests = _requests(args, 16)
        output_tokens = args.requests * args.new_tokens
        rates: dict[str, list[float]] = {"paged native": [], "padded transformers": []}
        ratios: list[float] = []
        for _ in range(args.rounds):
            (paged_s, paged_ids), (padded_s, padded_ids) = _run(paged, requests), _run(padded, requests)
            rates["paged native"].append(output_tokens / paged_s)
            rates["padded transformers"].append(output_tokens / padded_s)
            ratios.append(padded_s / paged_s)
            agree = sum(paged_ids[i] == padded_ids[i] for i in paged_ids)
            print(f"round: paged {output_tokens / paged_s:.1f} tok/s, padded transformers "
                  f"{output_tokens / padded_s:.1f} tok/s, ratio {ratios[-1]:.2f}x; "
                  f"greedy ids equal in {agree}/{len(paged_ids)} requests")
        medians = {name: statistics.median(values) for name, values in rates.items()}
        print(" | ".join(f"{name}: median {value:.1f} tok/s" for name, value in medians.items()),
              f"| median of the rounds' ratios {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
