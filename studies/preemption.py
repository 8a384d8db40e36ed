"""Preemption: many long requests against a deliberately small block pool, each checked against
its greedy text from an unconstrained run.

    python -m studies.preemption --requests 64 --max-new-tokens 128 --small-pool-tokens 1024 \\
        --output preemption.json [-- ztgi launch flags]

Launches ztgi (paged) twice: first with a pool of `--large-budget-mb` (room for every request at
once), then with `--max-batch-total-tokens` `--small-pool-tokens` (the pool's size in tokens,
rounded up to blocks), far less than the requests need together, so the scheduler has to
preempt (free the most recent request's blocks and requeue it to resume from its prompt and the
tokens it generated). Both runs send the same `--requests` distinct prompts all at once to
`/generate`, greedy with `ignore_eos`, so every request generates exactly `--max-new-tokens`.
Reported: preemptions (from `/metrics`, the claim needs > 0), failures, how many texts differ
from the unconstrained run's (the claim: none, no failure; a text that parts where the two best
tokens were a float near-tie is counted apart, see greedy_parity.py), and each run's wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time

import aiohttp

from studies.server_metrics import counter, scrape, server_info
from ztgi.bench.greedy_parity import GreedyStream, parts_at_near_tie
from ztgi.bench.launched_server import LaunchedServer
from ztgi.bench.workload import WORDS

logger = logging.getLogger(__name__)

TOPICS = ("a lighthouse keeper", "a bicycle", "the moon", "a forest in autumn", "a letter to a friend",
          "photosynthesis", "the rules of chess", "baking bread")


def prompts(count: int) -> list[str]:
    """`count` distinct prompts of a few dozen tokens (topic and a run of words differ per prompt)."""
    return [f"Write a long story about {TOPICS[i % len(TOPICS)]} that mentions these words: "
            + " ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(8 + i % 16)) for i in range(count)]


async def generate(session: aiohttp.ClientSession, url: str, prompt: str,
                   max_new_tokens: int) -> GreedyStream | None:
    """A greedy `/generate` with its top-2 candidates per token, or None (logged) when it failed."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "ignore_eos": True,
                                              "details": True, "top_n_tokens": 2}}
    async with session.post(url + "/generate", json=body) as response:
        if response.status != 200:
            logger.error("request failed: HTTP %d %s", response.status, await response.text())
            return None
        return GreedyStream.from_details((await response.json())["details"])


async def run_all(url: str, texts: list[str], max_new_tokens: int) -> dict:
    """Every prompt at once; the texts in prompt order, the preemptions and the pool seen meanwhile."""
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        info = await server_info(session, url)
        before = await scrape(session, url)
        started = time.perf_counter()
        outputs = await asyncio.gather(*[generate(session, url, text, max_new_tokens) for text in texts])
        seconds = time.perf_counter() - started
        after = await scrape(session, url)
    return {"texts": list(outputs), "seconds": round(seconds, 2),
            "preemptions": counter(after, "ztgi_preemptions") - counter(before, "ztgi_preemptions"),
            "kv_blocks_total": after.get("ztgi_kv_blocks_total"),
            "max_batch_total_tokens": info.get("max_batch_total_tokens")}


def served(flags: list[str], texts: list[str], max_new_tokens: int, startup_timeout_s: float) -> dict:
    with LaunchedServer(flags, startup_timeout_s) as server:
        return asyncio.run(run_all(server.url, texts, max_new_tokens))


def compare_runs(large: dict, small: dict) -> dict:
    """The small pool's run against the unconstrained one: failures, texts that part at a float
    near-tie (a resumed request's chunk computes other sums than decode steps), texts that differ
    otherwise (the claim: none), the verdict."""
    failures = sum(1 for run in (large, small) for stream in run["texts"] if stream is None)
    pairs = [(i, a, b) for i, (a, b) in enumerate(zip(large["texts"], small["texts"])) if a and b and a.ids != b.ids]
    near_ties = [i for i, a, b in pairs if parts_at_near_tie(a, b)]
    differ = [i for i, _, _ in pairs if i not in near_ties]
    return {"failures": failures, "texts_differ": differ, "parted_at_near_tie": near_ties,
            "claim_met": small["preemptions"] > 0 and not failures and not differ}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--small-pool-tokens", type=int, default=1024,
                        help="the small run's --max-batch-total-tokens (its pool); at least --max-total-tokens")
    parser.add_argument("--large-budget-mb", type=int, default=1024, help="the unconstrained run's --memory-budget-mb")
    parser.add_argument("--max-total-tokens", type=int, default=512, help="per request, both runs")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument("--output", help="write the figures (and the texts) here as JSON")
    parser.add_argument("flags", nargs="*", help="more ztgi launch flags, both runs (after --)")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.max_new_tokens < 1 or args.small_pool_tokens < args.max_total_tokens:
        parser.error("--requests and --max-new-tokens must be >= 1, --small-pool-tokens >= --max-total-tokens")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    texts = prompts(args.requests)
    common = ["--kv-cache", "paged", "--max-total-tokens", str(args.max_total_tokens),
              "--max-input-tokens", str(args.max_total_tokens - 1), *args.flags]
    large = served([*common, "--memory-budget-mb", str(args.large_budget_mb)], texts, args.max_new_tokens,
                   args.startup_timeout_s)
    small = served([*common, "--max-batch-total-tokens", str(args.small_pool_tokens)], texts, args.max_new_tokens,
                   args.startup_timeout_s)
    report = {"requests": args.requests, "max_new_tokens": args.max_new_tokens, "flags": args.flags,
              **compare_runs(large, small),
              **{f"{name}_{key}": run[key] for name, run in (("large", large), ("small", small))
                 for key in ("seconds", "preemptions", "kv_blocks_total", "max_batch_total_tokens")}}
    print(json.dumps(report, indent=2))
    if args.output:
        with open(args.output, "w") as file:
            streamed = {f"{name}_texts": [stream and stream.text for stream in run["texts"]]
                        for name, run in (("large", large), ("small", small))}
            json.dump({**report, **streamed}, file, indent=2)
    return 0 if report["claim_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
