"""Throughput with half the requests constrained by a JSON schema, against none constrained.

One launched server; rounds alternate (A B A B ...): in A no request has a grammar, in B every
other request has one of several JSON schemas (so compiles count too). Every request asks for the
same number of tokens with `ignore_eos` (a constrained row whose JSON is complete goes on with EOS
under its mask), so both sides generate the same tokens and the figure is output tokens per second.

    python -m studies.grammar_throughput [--concurrency 16] [--requests 32] [--tokens 64] [--rounds 3]

`--in-process` runs the same comparison on the worker's engine alone (one batch of `--concurrency`
requests, prefill then decode, no HTTP and no other process): on a shared machine its paired
rounds are seconds apart, where a launched server's are minutes apart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import aiohttp

from ztgi.bench.launched_server import LaunchedServer

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
     "required": ["name", "age"]},
    {"type": "array", "items": {"type": "object", "properties": {"city": {"type": "string"},
                                                                "rain": {"type": "boolean"}}}},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "sizes": {"type": "array", "items": {"type": "number"}}}},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                      "tags": {"type": "array", "items": {"type": "string"}}}},
]
PROMPT = "Describe a city as JSON, with its name, its population and three landmarks:"


async def one_request(session: aiohttp.ClientSession, url: str, tokens: int, schema: dict | None) -> int:
    parameters: dict[str, Any] = {"max_new_tokens": tokens, "ignore_eos": True, "details": True}
    if schema is not None:
        parameters["grammar"] = {"type": "json", "value": schema}
    async with session.post(url + "/generate", json={"inputs": PROMPT, "parameters": parameters}) as response:
        body = await response.json()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {body}")
        return body["details"]["generated_tokens"]


async def one_round(url: str, concurrency: int, num_requests: int, tokens: int, constrained: bool) -> float:
    """Output tokens per second of `num_requests` requests, `concurrency` at a time."""
    limit = asyncio.Semaphore(concurrency)

    async def limited(session: aiohttp.ClientSession, index: int) -> int:
        schema = SCHEMAS[(index // 2) % len(SCHEMAS)] if constrained and index % 2 else None
        async with limit:
            return await one_request(session, url, tokens, schema)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        started = time.perf_counter()
        counts = await asyncio.gather(*(limited(session, i) for i in range(num_requests)))
        return sum(counts) / (time.perf_counter() - started)


def engine_round(model: Any, tokenizer: Any, concurrency: int, tokens: int, constrained: bool) -> float:
    """Output tokens per second of one batch run to its end in the engine."""
    from ztgi.common.grammar import json_grammar
    from ztgi.common.messages import SamplingParameters, WorkerRequest

    input_ids = tokenizer.encode(PROMPT)
    requests = [WorkerRequest(i, input_ids, SamplingParameters(
        grammar=json_grammar(SCHEMAS[(i // 2) % len(SCHEMAS)]) if constrained and i % 2 else None),
        tokens, ignore_eos=True) for i in range(concurrency)]
    started = time.perf_counter()
    batch = model.batch_type.from_requests(requests, 1, concurrency * (len(input_ids) + tokens), model)
    generated = 0
    while batch is not None:
        generations, batch, _ = model.generate_token(batch)
        generated += len(generations)
    return generated / (time.perf_counter() - started)


def in_process(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    import torch

    from ztgi.services.tokenizer.loading import load_tokenizer
    from ztgi.services.worker.model_loader import load_model
    from ztgi.services.worker.sampling import grammar

    model = load_model(args.model_id, dtype="float32", device="cuda" if torch.cuda.is_available() else "cpu",
                       kv_cache="padded")
    tokenizer = load_tokenizer(args.model_id)
    _ = grammar.configure(args.model_id, sorted(model.eos_token_ids)).tokenizer  # loads the vocabulary
    engine_round(model, tokenizer, args.concurrency, 4, True)  # warm up both paths
    free, constrained = [], []
    for _ in range(args.rounds):
        free.append(engine_round(model, tokenizer, args.concurrency, args.tokens, False))
        constrained.append(engine_round(model, tokenizer, args.concurrency, args.tokens, True))
        print(json.dumps({"unconstrained_tok_s": round(free[-1], 1),
                          "half_constrained_tok_s": round(constrained[-1], 1)}), flush=True)
    return free, constrained


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flags", default="", help="extra `ztgi launch` flags")
    parser.add_argument("--in-process", action="store_true", help="the engine alone, no server")
    parser.add_argument("--model-id", default="smollm2")
    args = parser.parse_args(argv)
    if args.in_process:
        free, constrained = in_process(args)
    else:
        free, constrained = served(args)
    ratios = [c / f for c, f in zip(constrained, free)]
    print(json.dumps({"unconstrained_tok_s_median": round(statistics.median(free), 1),
                      "half_constrained_tok_s_median": round(statistics.median(constrained), 1),
                      "ratio_median": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios]}))


def served(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    flags = ["--max-batch-size", str(args.concurrency), *args.flags.split()]
    free, constrained = [], []
    with LaunchedServer(flags) as server:
        asyncio.run(one_round(server.url, args.concurrency, args.concurrency, 8, True))  # warm up both paths
        for _ in range(args.rounds):
            free.append(asyncio.run(one_round(server.url, args.concurrency, args.requests, args.tokens, False)))
            constrained.append(asyncio.run(one_round(server.url, args.concurrency, args.requests, args.tokens, True)))
            print(json.dumps({"unconstrained_tok_s": round(free[-1], 1),
                              "half_constrained_tok_s": round(constrained[-1], 1)}), flush=True)
    return free, constrained


if __name__ == "__main__":
    main()
