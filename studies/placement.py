"""Cache-aware placement against round-robin over HTTP: two launched servers of two workers each,
questions on two shared documents interleaved.

    python -m studies.placement [--requests 32] [--concurrency 4] [--tokens 8] [--rounds 3]
        [--patterns alternate,random] [--document-words 1100] [--flags "..."]

Both servers (`ztgi launch --num-workers 2 --placement cache-aware`, and `round-robin`) are up at
once and take turns (A B, then B A, ...). Each round builds two fresh documents (seeded by the
round), so both servers start the round with neither cached, and sends both the same requests:
`--requests` greedy questions, `--concurrency` at a time, `--tokens` new tokens each, each on
document A or B in the `--pattern` order (`alternate`: A B A B ...; `random`: drawn per
request). From each server's `/metrics` before and after, a round reports where its requests
landed (`ztgi_placement_requests`: on a worker holding the longest prefix of their input, or
not; `no_holder` when no worker held any of it, e.g. the first request on each document) and the
input tokens its workers computed rather than took from their caches; from the client, output
tokens/s, TTFT p50 and the total time. The last lines are medians over the rounds per pattern,
with the cache-aware / round-robin ratios of each round.

Round-robin deals requests by arrival (`seq_id` mod 2): with the `alternate` pattern and two
workers that parity is the document's, so round-robin keeps each document on one worker too;
`random` is the pattern where the two policies differ.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from studies.prefix_datasets import two_documents
from ztgi.bench.config import BenchConfig
from ztgi.bench.launched_server import LaunchedServer
from ztgi.bench.load_generator import LoadGenerator
from ztgi.bench.workload import Prompt

POLICIES = ("cache-aware", "round-robin")
OUTCOMES = ("holder", "not_holder", "no_holder")
NUM_WORKERS = 2


def scheduler_figures(url: str) -> dict[str, float]:
    """Placement outcomes and prefix-cache token counters from the server's `/metrics`."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    figures = dict.fromkeys([*OUTCOMES, "queried_tokens", "hit_tokens"], 0.0)
    names = {"ztgi_prefix_cache_queried_tokens": "queried_tokens", "ztgi_prefix_cache_hit_tokens": "hit_tokens"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name == "ztgi_placement_requests":
                figures[sample.labels["outcome"]] += sample.value
            elif name in names:
                figures[names[name]] += sample.value
    return figures


def wait_for_workers(url: str, timeout_s: float = 600.0) -> None:
    """/health answers once one worker is ready: wait until both are."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/info", timeout=30) as response:
            if json.load(response)["num_workers"] >= NUM_WORKERS:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url}: fewer than {NUM_WORKERS} workers ready after {timeout_s:.0f} s")


def one_run(url: str, prompts: list[Prompt], concurrency: int) -> dict:
    """The requests against one server: client figures and the scheduler's counters' increase."""
    before = scheduler_figures(url)
    config = BenchConfig(url=url, concurrency=concurrency, num_requests=len(prompts), progress=False)
    result = asyncio.run(LoadGenerator(config, prompts).run(concurrency))
    after = scheduler_figures(url)
    delta = {name: after[name] - before[name] for name in after}
    placed = delta["holder"] + delta["not_holder"]
    summary = result.summary
    return {
        "on_holder": delta["holder"] / placed if placed else None,
        **{name: int(delta[name]) for name in OUTCOMES},
        "computed_tokens": int(delta["queried_tokens"] - delta["hit_tokens"]),
        "output_tok_s": summary.output_token_throughput,
        "ttft_p50_s": summary.ttft_s.p50,
        "duration_s": summary.duration_s,
        "failures": summary.num_failures,
    }


def warm_up(url: str) -> None:
    """A few short requests, so each worker's first steps are behind us."""
    prompts = [Prompt(f"Say something about the number {i}.", 4) for i in range(2 * NUM_WORKERS)]
    config = BenchConfig(url=url, concurrency=NUM_WORKERS, num_requests=len(prompts), progress=False)
    asyncio.run(LoadGenerator(config, prompts).run(NUM_WORKERS))


def run_rounds(args: argparse.Namespace, urls: dict[str, str]) -> list[dict]:
    rows = []
    for pattern in args.patterns.split(","):
        for index in range(args.rounds):
            requests = two_documents(random.Random(f"{pattern}-{index}"), args.requests, pattern, args.document_words)
            prompts = [Prompt(text, args.tokens) for _, text in requests]
            order = POLICIES if index % 2 == 0 else POLICIES[::-1]
            for policy in order:
                row = {"pattern": pattern, "round": index, "placement": policy,
                       **one_run(urls[policy], prompts, args.concurrency)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def medians(rows: list[dict]) -> list[dict]:
    """Per pattern and policy: the median of each figure over the rounds; and the per-round ratios."""
    summaries = []
    for pattern in dict.fromkeys(row["pattern"] for row in rows):
        of = {p: [r for r in rows if r["pattern"] == pattern and r["placement"] == p] for p in POLICIES}
        for policy, runs in of.items():
            summaries.append({"pattern": pattern, "placement": policy, "rounds": len(runs), **{
                name: statistics.median(r[name] for r in runs if r[name] is not None)
                for name in ("on_holder", "computed_tokens", "output_tok_s", "ttft_p50_s", "duration_s")
                if any(r[name] is not None for r in runs)}})
        pairs = list(zip(*of.values()))
        summaries.append({"pattern": pattern, "ratio": "cache-aware / round-robin",
                          "output_tok_s": [round(a["output_tok_s"] / b["output_tok_s"], 3) for a, b in pairs],
                          "duration_s": [round(a["duration_s"] / b["duration_s"], 3) for a, b in pairs]})
    return summaries


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=8, help="new tokens per request (greedy)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per pattern, each policy once")
    parser.add_argument("--patterns", default="alternate,random", help="comma-separated: alternate, random")
    parser.add_argument("--document-words", type=int, default=1100, help="words per document (~1.1 tokens each)")
    parser.add_argument("--flags", default="", help="extra `ztgi launch` flags for both servers")
    args = parser.parse_args(argv)
    if not set(args.patterns.split(",")) <= {"alternate", "random"}:
        parser.error(f"--patterns {args.patterns!r}: use alternate, random or both")
    common = ["--num-workers", str(NUM_WORKERS), "--max-input-tokens", "2000", "--max-total-tokens", "2048",
              *args.flags.split()]
    with contextlib.ExitStack() as stack:
        urls = {}
        for policy in POLICIES:
            server = stack.enter_context(LaunchedServer([*common, "--placement", policy]))
            wait_for_workers(server.url)
            warm_up(server.url)
            urls[policy] = server.url
        rows = run_rounds(args, urls)
    for summary in medians(rows):
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

