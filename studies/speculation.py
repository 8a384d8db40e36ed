"""--speculate against speculation off, side by side in one run, over HTTP.

    python -m studies.speculation --speculate 4 --dtype float32 --repeats 3 --output spec.json

Two `ztgi launch` servers run at once on free ports, one with `--speculate N` and one without (each
otherwise idle while the other works); with `--draft-model-id`, a third proposes with that draft
model instead of prompt lookup (`draft`), the order rotating every repeat. Part one, one stream at a
time: input-grounded chat prompts (a code edit, a copy, a reformat), each sent greedily to every
server in turn, the order rotated every repeat (A B C, B C A, ...); each server's output tokens/s is the median
over repeats of its tokens over its wall time, and the texts must be identical. Part two,
`--concurrency` (default 32) requests at a time over the mixed set (`benchmarks/data/mixed.jsonl`,
`--ignore-eos` so both generate the same tokens), the servers again in turn per repeat. The
figures go to stdout as a table and, with `--output`, to a JSON file. On a shared CPU set
`ZTGI_CPU_IDLE_CLASS=false ZTGI_CPU_NICE=0`, or the workers yield to everything else.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import requests

from ztgi.bench.launched_server import LaunchedServer
from ztgi.bench.workload import MIXED_DATASET_PATH, Prompt, load_dataset

CODE = ("import json\n\n\ndef load_config(path):\n    with open(path) as f:\n        data = json.load(f)\n"
        "    if 'name' not in data:\n        raise ValueError('missing name')\n    return data\n\n\n"
        "def save_config(path, data):\n    with open(path, 'w') as f:\n        json.dump(data, f, indent=2)\n")
TEXT = ("The meeting is on Monday at 10am in room 4. Alice will present the budget. Bob will present the "
        "roadmap. Carol will take notes and send them to everyone after the meeting.")
GROUNDED = {
    "code-edit": "Rename the function load_config to read_config and repeat the whole code:\n" + CODE,
    "copy": "Repeat this code exactly, with nothing before or after it:\n" + CODE,
    "reformat": "Rewrite this text as a bulleted list, one sentence per bullet, keeping the words:\n" + TEXT,
}


def chat_body(text: str, max_new_tokens: int) -> dict:
    return {"model": "tgi", "messages": [{"role": "user", "content": text}], "max_tokens": max_new_tokens,
            "temperature": 0, "stream": False}


def one_stream(url: str, text: str, max_new_tokens: int) -> tuple[str, int, float]:
    """One greedy chat completion: its text, its completion tokens and the wall time."""
    started = time.perf_counter()
    response = requests.post(url + "/v1/chat/completions", json=chat_body(text, max_new_tokens), timeout=600)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    body = response.json()
    return body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"], elapsed


def concurrent_run(url: str, prompts: list[Prompt], concurrency: int) -> tuple[int, float]:
    """Every prompt through /generate, `concurrency` at a time: output tokens and wall time."""
    def send(prompt: Prompt) -> int:
        parameters = {"max_new_tokens": prompt.max_new_tokens, "ignore_eos": True, "details": True}
        body: dict[str, Any] = {"inputs": prompt.text, "parameters": parameters}
        response = requests.post(url + "/generate", json=body, timeout=1200)
        response.raise_for_status()
        return response.json()["details"]["generated_tokens"]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(send, prompts))
    return tokens, time.perf_counter() - started


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speculate", type=int, default=4)
    parser.add_argument("--draft-model-id", help="a third server proposes with this draft model (`draft`)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", default=",".join(GROUNDED), help="one-stream part: which of the prompts")
    parser.add_argument("--max-new-tokens", type=int, default=160, help="one-stream part: tokens per answer")
    parser.add_argument("--concurrency", type=int, default=32, help="part two's requests at a time (0: skip it)")
    parser.add_argument("--max-requests", type=int, default=64, help="part two: the first this many of the mixed set")
    parser.add_argument("--output", help="JSON file for the figures")
    args = parser.parse_args(argv)
    unknown = set(args.prompts.split(",")) - set(GROUNDED)
    if unknown:
        parser.error(f"--prompts: unknown {', '.join(sorted(unknown))} (known: {', '.join(GROUNDED)})")
    return args


def systems(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each server's flags: `off`, `on` (prompt lookup) and, with a draft model, `draft`."""
    flags = ["--dtype", args.dtype]
    out = {"off": flags, "on": [*flags, "--speculate", str(args.speculate)]}
    if args.draft_model_id:
        out["draft"] = [*out["on"], "--draft-model-id", args.draft_model_id]
    return out


def turns(names: list[str], repeat: int) -> list[str]:
    """The servers' order in a repeat: rotated by one each time (A B C, B C A, ...)."""
    shift = repeat % len(names)
    return names[shift:] + names[:shift]


def one_stream_part(servers: dict[str, str], args: argparse.Namespace) -> dict:
    results = {}
    names = list(servers)
    for name in args.prompts.split(","):
        runs: dict[str, list[tuple[str, int, float]]] = {system: [] for system in names}
        for repeat in range(args.repeats + 1):  # the first round warms every server up and is not counted
            for system in turns(names, repeat):
                runs[system].append(one_stream(servers[system], GROUNDED[name], args.max_new_tokens))
        texts = {run[0] for system in runs for run in runs[system]}
        rates = {system: statistics.median(t / s for _, t, s in runs[system][1:]) for system in names}
        results[name] = {
            "identical_texts": len(texts) == 1, "tokens": runs["off"][1][1],
            "runs": {system: [t / s for _, t, s in runs[system][1:]] for system in names},
            **{f"{system}_tokens_per_s": rates[system] for system in names},
            **{f"{system}_ratio": rates[system] / rates["off"] for system in names if system != "off"},
            "ratio": rates["on"] / rates["off"]}
        others = "  ".join(f"{system} {rates[system]:6.1f} tok/s x{rates[system] / rates['off']:.2f}"
                           for system in names if system != "off")
        print(f"{name:10s} tokens {runs['off'][1][1]:4d}  off {rates['off']:6.1f} tok/s  {others}  "
              f"identical texts: {len(texts) == 1}", flush=True)
    return results


def concurrent_part(servers: dict[str, str], args: argparse.Namespace) -> dict:
    prompts = load_dataset(MIXED_DATASET_PATH)[:args.max_requests]
    names = list(servers)
    throughputs: dict[str, list[float]] = {system: [] for system in names}
    for repeat in range(args.repeats):
        for system in turns(names, repeat):
            tokens, seconds = concurrent_run(servers[system], prompts, args.concurrency)
            throughputs[system].append(tokens / seconds)
    rates = {system: statistics.median(throughputs[system]) for system in names}
    print(f"mixed x{args.concurrency}: " + "  ".join(f"{system} {rates[system]:6.1f} tok/s" for system in names)
          + f"  on/off x{rates['on'] / rates['off']:.2f}", flush=True)
    return {"concurrency": args.concurrency, "requests": len(prompts), "runs": throughputs,
            **{f"{system}_tokens_per_s": rates[system] for system in names}, "ratio": rates["on"] / rates["off"]}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        servers = {system: stack.enter_context(LaunchedServer(flags)).url for system, flags in systems(args).items()}
        results = {"speculate": args.speculate, "dtype": args.dtype, "draft_model_id": args.draft_model_id,
                   "one_stream": one_stream_part(servers, args), "concurrent": {}}
        if args.concurrency:
            results["concurrent"] = concurrent_part(servers, args)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
