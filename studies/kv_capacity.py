"""Capacity: how many requests the paged and the padded engine run at once on one KV budget.

    python -m studies.kv_capacity --memory-budget-mb 64 --concurrency 64 --output capacity.json

Launches ztgi twice with the same `--memory-budget-mb` (`--kv-cache paged`, then `--kv-cache
padded`), sends the mixed set (`--dataset`) closed-loop at `--concurrency` with `ignore_eos`,
and samples the scheduler's running-request count (`ztgi_requests_running` in the gateway's
`/metrics`) every `--sample-interval-s` while it runs. Reported per engine: the max and median
running, the output tok/s, preemptions; then paged / padded for each. The budget is meant to be
small enough that the padded worker's `max_batch_total_tokens` binds (it holds ~8-16 mixed
requests): that is where the layouts differ. The claim (issue 14): the paged engine's max
running is at least 2x the padded one's. With `--window-s` each engine is measured for that many
seconds after the load starts (the requests still in flight are then cancelled) and its tok/s is
the scheduler's generated-token count over the window: for a machine too slow to finish the set.
Extra `ztgi launch` flags go after `--`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

import aiohttp

from studies.server_metrics import RunningSampler, counter, scrape, server_info
from ztgi.bench.config import BenchConfig
from ztgi.bench.launched_server import LaunchedServer
from ztgi.bench.load_generator import LoadGenerator
from ztgi.bench.offline_workload import load_prompts
from ztgi.bench.workload import Prompt

logger = logging.getLogger(__name__)

KV_CACHES = ("paged", "padded")
CLAIM_RATIO = 2.0


async def measure(url: str, prompts: list[Prompt], concurrency: int, interval_s: float,
                  window_s: float | None = None) -> dict:
    """One closed-loop run of the prompts (or its first `window_s`), the running count sampled meanwhile."""
    bench = BenchConfig(url=url, dataset="mixed", num_requests=len(prompts), ignore_eos=True, progress=False)
    warm = BenchConfig(url=url, dataset="mixed", num_requests=min(len(prompts), 8), ignore_eos=True, progress=False)
    await LoadGenerator(warm, [Prompt(p.text, 2) for p in prompts[:8]]).run(8)
    sampler, stop = RunningSampler(url, interval_s), asyncio.Event()
    async with aiohttp.ClientSession() as session:
        info = await server_info(session, url)
        before = await scrape(session, url)
        sampling = asyncio.create_task(sampler.run(session, stop))
        load = asyncio.create_task(LoadGenerator(bench, prompts).run(concurrency))
        done, _ = await asyncio.wait([load], timeout=window_s)
        stop.set()
        await sampling
        after = await scrape(session, url)
        if not done:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
    generated = counter(after, "ztgi_generated_tokens") - counter(before, "ztgi_generated_tokens")
    if done:
        summary = load.result().summary
        figures: dict[str, float | int | bool | None] = {
                   "output_tok_s": summary.output_token_throughput, "duration_s": summary.duration_s,
                   "num_output_tokens": summary.num_output_tokens, "num_failures": summary.num_failures}
    else:
        assert window_s is not None, "only a window cuts a run short"
        figures = {"output_tok_s": generated / window_s, "duration_s": window_s, "num_output_tokens": generated,
                   "num_failures": 0, "finished": counter(after, "ztgi_requests_finished")
                   - counter(before, "ztgi_requests_finished"), "cut_at_window": True}
    return {**sampler.figures(), **figures,
            "preemptions": counter(after, "ztgi_preemptions") - counter(before, "ztgi_preemptions"),
            "prefill_chunks": counter(after, "ztgi_prefill_chunks") - counter(before, "ztgi_prefill_chunks"),
            "kv_blocks_total": after.get("ztgi_kv_blocks_total"),
            "max_batch_total_tokens": info.get("max_batch_total_tokens"),
            "info": {k: info.get(k) for k in ("kv_cache", "block_size", "num_blocks")}}


def _ratio(paged: float | None, padded: float | None) -> float | None:
    return None if paged is None or not padded else paged / padded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memory-budget-mb", type=int, default=64)
    parser.add_argument("--max-total-tokens", type=int, default=512,
                        help="per request; the padded warmup needs the budget to hold one such request")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--dataset", default="mixed")
    parser.add_argument("--max-requests", type=int, default=None, help="the first N prompts only")
    parser.add_argument("--sample-interval-s", type=float, default=0.1)
    parser.add_argument("--window-s", type=float, default=None,
                        help="measure each engine this long, then cancel what is in flight (default: the whole set)")
    parser.add_argument("--output", help="write the figures here as JSON")
    parser.add_argument("flags", nargs="*", help="more ztgi launch flags (after --)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prompts = load_prompts(args.dataset, max_requests=args.max_requests)
    results = {}
    for kv_cache in KV_CACHES:
        flags = ["--kv-cache", kv_cache, "--memory-budget-mb", str(args.memory_budget_mb),
                 "--max-total-tokens", str(args.max_total_tokens),
                 "--max-input-tokens", str(args.max_total_tokens - 1), *args.flags]
        with LaunchedServer(flags) as server:
            results[kv_cache] = asyncio.run(measure(server.url, prompts, args.concurrency, args.sample_interval_s,
                                                    args.window_s))
        logger.info("%s: %s", kv_cache, results[kv_cache])
    paged, padded = results["paged"], results["padded"]
    ratios = {name: _ratio(paged[name], padded[name]) for name in ("max_running", "median_running", "output_tok_s")}
    report = {"memory_budget_mb": args.memory_budget_mb, "concurrency": args.concurrency,
              "num_requests": len(prompts), "flags": args.flags, **results, "paged_over_padded": ratios,
              "claim_met": (ratios["max_running"] or 0) >= CLAIM_RATIO
              and not paged["num_failures"] and not padded["num_failures"]}
    print(json.dumps(report, indent=2))
    if args.output:
        with open(args.output, "w") as file:
            json.dump(report, file, indent=2)
    return 0 if report["claim_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
