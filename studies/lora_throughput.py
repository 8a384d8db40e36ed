"""Four LoRA adapters mixed in one server's traffic against the base model alone, side by side.

    python -m studies.lora_throughput --repeats 3

One `ztgi launch` of the default model (SmolLM2-135M-Instruct, its GGUF as stored) with four
random-weight adapters (`--lora-adapters`, made here with PEFT for the model's shapes: ranks 8, 8,
16 and 16 over every attention and MLP projection, the heaviest mix a request can ask for). Each
repeat runs the same closed-loop load twice in turn, `base` (no adapter) then `mixed` (request i
asks for adapter i mod 4), at `--concurrency` requests in flight over generated prompts of
`--input-tokens` words and `--output-tokens` tokens with EOS ignored, so both generate the same
number of tokens; each run draws prompts of its own, so none reads another's prefix cache. Output
tokens/s per run, each system's median, and the median of the repeats' mixed/base ratios go to
stdout. On a shared CPU set `ZTGI_CPU_IDLE_CLASS=false ZTGI_CPU_NICE=0`.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile

import torch

from ztgi.bench.bench import run_event_loop
from ztgi.bench.config import BenchConfig
from ztgi.bench.launched_server import LaunchedServer
from ztgi.bench.load_generator import LoadGenerator
from ztgi.bench.workload import generate_prompts
from ztgi.common.model_source import resolve_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANKS = {"a": 8, "b": 8, "c": 16, "d": 16}


def save_adapters(directory: str) -> dict[str, str]:
    """Four adapters for the default model's shapes (random base weights: only shapes matter)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(resolve_model().path)
    paths = {}
    for seed, (name, rank) in enumerate(RANKS.items()):
        torch.manual_seed(seed)
        model = get_peft_model(AutoModelForCausalLM.from_config(config),
                               LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False))
        paths[name] = f"{directory}/{name}"
        model.save_pretrained(paths[name])
    return paths


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as directory:
        adapters = save_adapters(directory)
        flags = ["--lora-adapters", ",".join(f"{name}={path}" for name, path in adapters.items())]
        rates: dict[str, list[float]] = {"base": [], "mixed": []}
        with LaunchedServer(flags) as server:
            config = BenchConfig(url=server.url, concurrency=args.concurrency, num_requests=args.requests,
                                 ignore_eos=True, progress=False)
            warmup = generate_prompts(args.concurrency, args.input_tokens, args.output_tokens, seed=10_000)
            run_event_loop(LoadGenerator(config, warmup).run(args.concurrency))
            for repeat in range(args.repeats):
                for turn, (system, names) in enumerate((("base", None), ("mixed", ",".join(adapters)))):
                    # prompts of their own each run: no run reads another's prefix cache
                    prompts = generate_prompts(args.requests, args.input_tokens, args.output_tokens,
                                               seed=2 * repeat + turn)
                    generator = LoadGenerator(dataclasses.replace(config, lora_adapters=names), prompts)
                    result = run_event_loop(generator.run(args.concurrency))
                    failed = result.summary.num_failures
                    rates[system].append(result.summary.output_token_throughput)
                    print(f"repeat {repeat + 1} {system}: {rates[system][-1]:.1f} output tok/s, {failed} failed",
                          flush=True)
    ratios = [mixed / base for base, mixed in zip(rates["base"], rates["mixed"], strict=True)]
    print(f"median: base {statistics.median(rates['base']):.1f} tok/s, mixed {statistics.median(rates['mixed']):.1f} "
          f"tok/s; mixed/base {statistics.median(ratios):.2f}x (repeats {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
