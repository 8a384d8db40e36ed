"""Chunked prefill: how long a long prompt holds up streams that are already decoding.

    python -m studies.chunked_prefill --output chunked.json [-- ztgi launch flags]

Starts ztgi (`ztgi launch` with the given flags, the defaults otherwise), runs `--streams` greedy
streams alone (the undisturbed texts), then again, and once every stream has produced a few
tokens sends one prompt of `--long-tokens` tokens. Reported: the long request's time to answer,
each stream's longest gap between two tokens while it ran, the worst gap as a share of the long
request's time (the stall; the paged engine's claim is at most 0.35 with default flags, where a
padded worker prefills the whole prompt in one step and stalls every stream for all of it), and
whether every stream's text equals its undisturbed text.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import aiohttp

from ztgi.bench.baseline_model import load_tokenizer
from ztgi.bench.launched_server import LaunchedServer
from ztgi.common.model_source import DEFAULT_MODEL_ID

STREAM_PROMPTS = [
    "Write a short story about a lighthouse keeper.", "Explain how a bicycle works.",
    "List ten facts about the moon.", "Describe a walk through a forest in autumn.",
    "Write a letter to a friend about your week.", "Explain photosynthesis to a child.",
    "Describe the rules of chess.", "Write a recipe for bread.",
]
LONG_TEXT = ("The history of the river valley is written in its stones, its fields and the names of its "
             "villages, each of which tells of the people who settled there and the work they did. ")


async def stream(session: aiohttp.ClientSession, url: str, prompt: str, max_new_tokens: int,
                 arrivals: list[float]) -> str:
    """A greedy /generate_stream; appends each token's arrival time; returns the text."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "ignore_eos": True}}
    text = []
    async with session.post(url + "/generate_stream", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            if line.startswith(b"data:"):
                event = json.loads(line[5:])
                arrivals.append(time.perf_counter())
                text.append(event["token"]["text"])
    return "".join(text)


async def streams_alone(url: str, count: int, max_new_tokens: int) -> list[str]:
    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*[stream(session, url, STREAM_PROMPTS[i % len(STREAM_PROMPTS)],
                                                  max_new_tokens, []) for i in range(count)]))


async def streams_with_long_prompt(url: str, count: int, max_new_tokens: int, long_prompt: str) -> dict:
    arrivals: list[list[float]] = [[] for _ in range(count)]
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(stream(session, url, STREAM_PROMPTS[i % len(STREAM_PROMPTS)], max_new_tokens,
                                            arrivals[i])) for i in range(count)]
        while min(len(a) for a in arrivals) < 5:
            await asyncio.sleep(0.01)
        sent = time.perf_counter()
        async with session.post(url + "/generate", json={"inputs": long_prompt,
                                                         "parameters": {"max_new_tokens": 1}}) as response:
            response.raise_for_status()
            await response.json()
        answered = time.perf_counter()
        texts = await asyncio.gather(*tasks)
    gaps = [_longest_gap(a, sent, answered) for a in arrivals]
    return {"texts": list(texts), "long_seconds": answered - sent, "longest_gaps_s": gaps}


def _longest_gap(arrivals: list[float], start: float, end: float) -> float:
    """The longest wait for a token while the long request ran: from the last token before it
    was sent, through the tokens during it, to the first token after its answer."""
    before = [t for t in arrivals if t <= start][-1:]
    during = [t for t in arrivals if start < t < end]
    after = [t for t in arrivals if t >= end][:1]
    ticks = before + during + after
    return max((b - a for a, b in zip(ticks, ticks[1:])), default=end - start)


def long_prompt(num_tokens: int) -> str:
    tokenizer = load_tokenizer(DEFAULT_MODEL_ID)
    ids = tokenizer(LONG_TEXT * (num_tokens // 20 + 1), add_special_tokens=False)["input_ids"][:num_tokens]
    text = tokenizer.decode(ids)
    assert isinstance(text, str), "one sequence decodes to one string"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-tokens", type=int, default=120)
    parser.add_argument("--long-tokens", type=int, default=3000)
    parser.add_argument("--claim", type=float, default=0.35, help="the largest stall share that passes")
    parser.add_argument("--output", help="write the figures here as JSON")
    parser.add_argument("flags", nargs="*", help="ztgi launch flags (after --)")
    args = parser.parse_args(argv)
    prompt = long_prompt(args.long_tokens)
    with LaunchedServer(args.flags) as server:
        alone = asyncio.run(streams_alone(server.url, args.streams, args.stream_tokens))
        disturbed = asyncio.run(streams_with_long_prompt(server.url, args.streams, args.stream_tokens, prompt))
    stall = max(disturbed["longest_gaps_s"]) / disturbed["long_seconds"]
    result = {"flags": args.flags, "streams": args.streams, "long_tokens": args.long_tokens,
              "long_seconds": round(disturbed["long_seconds"], 3),
              "longest_gaps_s": [round(g, 3) for g in disturbed["longest_gaps_s"]],
              "stall_share": round(stall, 3), "texts_equal": disturbed["texts"] == alone,
              "claim_met": stall <= args.claim and disturbed["texts"] == alone}
    print(json.dumps(result, indent=2))
    if args.output:
        with open(args.output, "w") as file:
            json.dump(result, file, indent=2)
    return 0 if result["claim_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
