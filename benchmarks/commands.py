"""`ztgi bench <subcommand>`: the benchmark tool's subcommands (as `vllm bench serve|throughput|latency`).

`ztgi bench` with no subcommand, or with only `serve`'s flags, runs `serve`, so every command
written before the subcommands still runs; `ztgi bench --offline ...` is `ztgi bench throughput ...`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("ztgi.bench.bench", "load a running server (TGI or OpenAI API) over HTTP: throughput, TTFT, TPOT, ITL"),
    "latency": ("ztgi.bench.latency", "one request at a time against a running server: a single stream's TTFT, TPOT"),
    "throughput": ("ztgi.bench.offline", "offline: ztgi.LLM.generate on the whole workload in this process, "
                                         "beside static batching and the engine alone"),
    "compare": ("ztgi.bench.compare", "static batching, the engine alone and a launched ztgi over HTTP, side by side"),
    "llama-cpp": ("ztgi.bench.llama_cpp", "launched ztgi systems and llama.cpp's llama-server on one GGUF, "
                                          "side by side"),
    "static": ("ztgi.bench.static_batching", "transformers' generate in static batches: the baseline alone"),
    "engine": ("ztgi.bench.engine_alone", "the worker's engine in process at N requests in flight: the ceiling alone"),
}
OFFLINE_ALIAS = "--offline"


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: ztgi bench [SUBCOMMAND] [FLAGS]   (`ztgi bench SUBCOMMAND --help` for its flags)", "",
             *(f"  {name:<{width}}  {about}" for name, (_, about) in SUBCOMMANDS.items()), "",
             "With no subcommand: serve (`ztgi bench --offline`: throughput)."]
    return "\n".join(lines) + "\n"


def resolve(argv: Sequence[str]) -> tuple[str, list[str]]:
    """The subcommand `argv` names and its own flags."""
    args = list(argv)
    if args and args[0] in SUBCOMMANDS:
        return args[0], args[1:]
    if OFFLINE_ALIAS in args:
        return "throughput", [arg for arg in args if arg != OFFLINE_ALIAS]
    return "serve", args


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        sys.stdout.write(usage())
        return 0
    name, rest = resolve(args)
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)
