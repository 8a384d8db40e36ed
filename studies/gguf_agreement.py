"""How far each GGUF block type's greedy tokens drift from the float weights', for ztgi and for llama.cpp.

    python -m studies.gguf_agreement --llama-cpp-build /work/llama.cpp-build \\
        --output gguf_agreement.json --markdown gguf_agreement.md

The anchor is the source GGUF (the embedded SmolLM2 Q4_1 unless `--gguf`) dequantized into an F16
file; llama.cpp's `llama-quantize` makes one file of each `--types` from it (`gguf_anchor`). On the
same prompts (the first `--max-requests` of `--dataset`, `--output-tokens` greedy tokens each, EOS
ignored unless `--no-ignore-eos`), as the same token ids on both sides:
- ztgi serves each type's file as stored (`--quantize`, `--dtype`: the default launch's) against
  ztgi on the anchor with `--quantize none --dtype float32` (the float weights, exactly);
- llama-server serves each type's file against llama-server on the anchor (F16 weights).
Reported per type and server: the share of requests whose ids are all identical to the anchor's,
the median and mean number of positions before a request's first divergence (a request that
never diverges counts all its positions), and the median, over the diverging requests, of the
anchor's logprob gap between its two best candidates where the type's run parted from it.
Which tensor types each file really holds is reported too: llama-quantize writes a fallback type
where a tensor's rows do not fit the type's blocks.
The anchor and type files stay in `--work-dir`, and so do llama-server's ids (by its version, the
file and the requests): a second run of the study computes only ztgi's again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from studies.gguf_anchor import AnchorFiles, tensor_types
from studies.greedy_runs import Candidates, GreedyRequests, GreedyRun, llama_server_greedy, ztgi_greedy
from ztgi.bench.baseline_setup import parse_workload
from ztgi.bench.offline_workload import encode_prompts
from ztgi.common.config import require
from ztgi.common.model_source import cache_root, embedded_gguf_path
from ztgi.services.tokenizer.loading import load_tokenizer

logger = logging.getLogger(__name__)

FILE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")
ANCHOR_DTYPE, ANCHOR_QUANTIZE = "float32", "none"
SERVERS = ("ztgi", "llama-server")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class GgufAgreementConfig:
    """Greedy agreement of each GGUF block type with the float anchor, ztgi's beside llama-server's."""

    llama_cpp_build: str = dataclasses.field(default="/work/llama.cpp-build", metadata=_help(
        "llama.cpp's build directory (bin/llama-server, bin/llama-quantize)"))
    gguf: str = dataclasses.field(default="", metadata=_help("the source GGUF (default: the embedded SmolLM2's)"))
    types: str = dataclasses.field(default=",".join(FILE_TYPES), metadata=_help(
        "llama-quantize's file types, comma-separated"))
    dataset: str = dataclasses.field(default="mixed", metadata=_help("JSONL of {prompt, max_new_tokens}, or `mixed`"))
    output_tokens: int | None = dataclasses.field(default=32, metadata=_help("greedy tokens per request"))
    max_requests: int | None = dataclasses.field(default=32, metadata=_help("the first N prompts"))
    ignore_eos: bool = dataclasses.field(default=True, metadata=_help(
        "every request generates exactly its tokens (false: EOS ends it)"))
    dtype: str = dataclasses.field(default="bfloat16", metadata=_help("ztgi's activations on the type files"))
    quantize: str = dataclasses.field(default="gguf", metadata=_help(
        "ztgi's --quantize on the type files (gguf: the blocks as stored)"))
    num_threads: int = dataclasses.field(default=1, metadata=_help(
        "llama-server -t and llama-quantize's threads (the ids do not depend on it; on a busy machine more than "
        "one thread waits on the others at every step)"))
    work_dir: str = dataclasses.field(default="", metadata=_help(
        "where the anchor and type files are made and kept (default: the ztgi cache's gguf-agreement/)"))
    output: str | None = dataclasses.field(default=None, metadata=_help("write the JSON results here"))
    markdown: str | None = dataclasses.field(default=None, metadata=_help("write the Markdown table here"))
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        for name in ("llama-server", "llama-quantize"):
            path = self.binary(name)
            require(os.path.isfile(path) and os.access(path, os.X_OK),
                    f"--llama-cpp-build {self.llama_cpp_build!r} has no executable bin/{name}")
        require(bool(self.file_types), "--types names no file type")
        require(self.num_threads >= 1, f"--num-threads must be >= 1, got {self.num_threads}")
        require(not self.gguf or os.path.isfile(self.gguf), f"--gguf {self.gguf!r} is not a file")

    def binary(self, name: str) -> str:
        return os.path.join(self.llama_cpp_build, "bin", name)

    @property
    def file_types(self) -> list[str]:
        return [name.strip() for name in self.types.split(",") if name.strip()]

    def source(self) -> str:
        return self.gguf or embedded_gguf_path()

    def files(self) -> AnchorFiles:
        directory = self.work_dir or os.path.join(cache_root(), "gguf-agreement")
        return AnchorFiles(self.source(), directory, self.binary("llama-quantize"), self.num_threads)


@dataclasses.dataclass(frozen=True)
class Agreement:
    """One run's ids against the anchor run's, request by request; at each request's first divergence,
    how close the anchor's own two best candidates were (their logprob gap: small where greedy took a
    near coin toss, large where the weights' error outweighed a clear preference)."""

    positions_before_divergence: list[int]
    identical: list[bool]
    anchor_gaps_at_divergence: list[float]

    @classmethod
    def of(cls, anchor: GreedyRun, other: GreedyRun) -> Agreement:
        assert len(anchor.ids) == len(other.ids), (len(anchor.ids), len(other.ids))
        positions = [first_divergence(a, o) for a, o in zip(anchor.ids, other.ids)]
        identical = [a == o for a, o in zip(anchor.ids, other.ids)]
        gaps = [gap for steps, at, same in zip(anchor.top2, positions, identical)
                if not same and (gap := top2_gap(steps, at)) is not None]
        return cls(positions, identical, gaps)

    def summary(self) -> dict[str, float | None]:
        positions, gaps = self.positions_before_divergence, self.anchor_gaps_at_divergence
        return {"requests_identical": sum(self.identical) / len(self.identical),
                "median_positions_before_divergence": float(statistics.median(positions)),
                "mean_positions_before_divergence": statistics.fmean(positions),
                "median_anchor_gap_at_divergence": float(statistics.median(gaps)) if gaps else None}


def first_divergence(anchor: Sequence[int], other: Sequence[int]) -> int:
    """How many leading ids agree (the shorter one's length where one is the other's prefix)."""
    return next((i for i, (a, o) in enumerate(zip(anchor, other)) if a != o), min(len(anchor), len(other)))


def top2_gap(steps: Sequence[Candidates], at: int) -> float | None:
    """The logprob gap between the two best candidates at position `at` (None past the end, or without two)."""
    if at >= len(steps) or len(steps[at]) < 2:
        return None
    (_, best), (_, second) = steps[at][:2]
    return best - second


class RunCache:
    """llama-server's ids kept in a JSON file, by its version, the GGUF and the requests: ztgi is what
    changes from one run of this study to the next, llama.cpp's build does not."""

    def __init__(self, path: str, version: str, requests: GreedyRequests) -> None:
        self.path, self.version = path, version
        self.requests_digest = hashlib.sha256(json.dumps(dataclasses.asdict(requests)).encode()).hexdigest()[:16]
        self.entries: dict[str, dict[str, Any]] = {}
        if os.path.exists(path):
            with open(path) as file:
                self.entries = json.load(file)

    def key(self, gguf: str) -> str:
        return f"{self.version}|{os.path.basename(gguf)}|{self.requests_digest}|ids+top2"

    def get(self, gguf: str) -> GreedyRun | None:
        entry = self.entries.get(self.key(gguf))
        return None if entry is None else GreedyRun.from_json(entry)

    def put(self, gguf: str, run: GreedyRun) -> None:
        self.entries[self.key(gguf)] = run.to_json()
        with open(self.path + ".partial", "w") as file:
            json.dump(self.entries, file)
        os.replace(self.path + ".partial", self.path)


class AgreementRun:
    """Both servers' anchor runs once, then each type's file on both, measured against them."""

    def __init__(self, config: GgufAgreementConfig, requests: GreedyRequests, llama_version: str) -> None:
        self.config, self.requests = config, requests
        self.files = config.files()
        self.llama_runs = RunCache(self.files.prefix + "-llama-server-runs.json", llama_version, requests)
        self.anchor_runs: dict[str, GreedyRun] = {}

    def greedy(self, server: str, gguf: str, anchor: bool) -> GreedyRun:
        if server == "llama-server":
            return self.llama_server_greedy(gguf)
        dtype, quantize = (ANCHOR_DTYPE, ANCHOR_QUANTIZE) if anchor else (self.config.dtype, self.config.quantize)
        return ztgi_greedy(gguf, dtype, quantize, self.requests)

    def llama_server_greedy(self, gguf: str) -> GreedyRun:
        run = self.llama_runs.get(gguf)
        if run is None:
            run = llama_server_greedy(self.config.binary("llama-server"), gguf, self.requests, self.config.num_threads)
            self.llama_runs.put(gguf, run)
        else:
            logger.info("llama-server's ids on %s: kept from an earlier run (%s)", gguf, self.llama_runs.path)
        return run

    def run_anchor(self) -> dict[str, Any]:
        anchor = self.files.make_anchor()
        for server in SERVERS:
            logger.info("%s on the anchor %s", server, anchor)
            self.anchor_runs[server] = self.greedy(server, anchor, anchor=True)
        ztgi, llama = (self.anchor_runs[server] for server in SERVERS)
        return {"file": anchor, "tensor_types": tensor_types(anchor), "ztgi_against_llama_server":
                Agreement.of(ztgi, llama).summary(), "runs": {s: run.to_json() for s, run in self.anchor_runs.items()}}

    def run_type(self, file_type: str) -> dict[str, Any]:
        path = self.files.make_type_file(file_type)
        result: dict[str, Any] = {"type": file_type, "file": path, "file_bytes": os.path.getsize(path),
                                  "tensor_types": tensor_types(path), "runs": {}}
        for server in SERVERS:
            logger.info("%s on %s", server, path)
            try:
                run = self.greedy(server, path, anchor=False)
            except Exception as exc:  # one server failing on one type is a result; the other rows still run
                logger.exception("%s failed on %s", server, path)
                result[server] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            result["runs"][server] = run.to_json()
            result[server] = Agreement.of(self.anchor_runs[server], run).summary()
            logger.info("%s %s: %s", server, file_type, result[server])
        return result


def markdown_table(types: Sequence[dict[str, Any]]) -> str:
    """One row per type: what the file holds, then each server's agreement with its own anchor."""
    header = [f"{server}: {what}" for server in SERVERS for what in (
        "requests identical", "positions before divergence, median / mean", "anchor's top-2 gap there, median")]
    lines = ["| " + " | ".join(["file type", "tensor types in the file", *header]) + " |", "|---" * 8 + "|"]
    for row in types:
        held = ", ".join(f"{name} {count}" for name, count in row["tensor_types"].items())
        cells = [row["type"], held, *(cell for server in SERVERS for cell in _server_cells(row[server]))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _server_cells(figures: dict[str, Any]) -> list[str]:
    """A server's three cells: the share identical, the median / mean positions, the anchor's gap (or its error)."""
    if "error" in figures:
        return ["failed", figures["error"].splitlines()[0][:80].replace("|", "/"), ""]
    gap = figures["median_anchor_gap_at_divergence"]
    return [f"{figures['requests_identical']:.0%}",
            f"{figures['median_positions_before_divergence']:g} / {figures['mean_positions_before_divergence']:.1f}",
            "-" if gap is None else f"{gap:.3f}"]


def anchors_line(figures: dict[str, Any]) -> str:
    """The two anchor runs against each other: the same F16 weights, ztgi in float32, llama.cpp in its own way."""
    return (f"\nThe anchors against each other (ztgi float32 as the reference, llama-server on the F16 file): "
            f"{figures['requests_identical']:.0%} of requests identical, "
            f"{figures['median_positions_before_divergence']:g} / {figures['mean_positions_before_divergence']:.1f} "
            "positions before divergence (median / mean).\n")


def git_commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__)))
    return result.stdout.strip() or "unknown"


def llama_server_version(binary: str) -> str:
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    lines = (result.stdout + result.stderr).strip().splitlines()
    return next((line for line in lines if line.startswith("version")), lines[0] if lines else "unknown")


def main(argv: Sequence[str] | None = None) -> int:
    setup = parse_workload(GgufAgreementConfig, argv, "gguf_agreement")
    if setup is None:
        return 2
    config, prompts = setup
    encoded = encode_prompts(load_tokenizer(config.source()), prompts)
    requests = GreedyRequests([r.input_ids for r in encoded], [r.max_new_tokens for r in encoded], config.ignore_eos)
    llama_version = llama_server_version(config.binary("llama-server"))
    run = AgreementRun(config, requests, llama_version)
    anchor = run.run_anchor()
    types = [run.run_type(file_type) for file_type in config.file_types]
    results = {"config": dataclasses.asdict(config), "source": config.source(), "ztgi_commit": git_commit(),
               "llama_server_version": llama_version,
               "num_requests": len(requests.input_ids), "anchor": anchor, "types": types}
    table = markdown_table(types) + anchors_line(anchor["ztgi_against_llama_server"])
    sys.stdout.write(table)
    if config.output:
        with open(config.output, "w") as file:
            json.dump(results, file, indent=1)
    if config.markdown:
        with open(config.markdown, "w") as file:
            file.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
