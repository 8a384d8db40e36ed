"""ztgi against llama.cpp's `llama-server`: the same GGUF, the same prompts, the same client, one run.

    ztgi bench llama-cpp --llama-server /work/llama.cpp-build/bin/llama-server \\
        --systems ztgi-float32,ztgi-bfloat16,ztgi-bfloat16-int8 --concurrencies 1,16 --repeats 3 \\
        --output llama_cpp.json --plot llama_cpp.png

`llama-server` serves the GGUF file ztgi loads (the embedded model's unless `--gguf`), with the
flags its documentation gives for a CPU server of `--num-threads` cores: `-np 16 -cb -t 2`, a
context of 16 slots x `--slot-context` tokens. Both servers' prompt caches are off (ztgi's prefix
caching, llama-server's `cache_prompt`): every repeat sends the same prompts, and a cache would make
the second and later ones nearly free to prefill (`--prompt-cache` turns both on).
llama-server runs at the priority ztgi's CPU worker takes (nice 10, Linux's SCHED_IDLE class), so
that on a machine shared with other work neither server is starved more than the other
(`--no-llama-as-ztgi-worker`: normal priority).
Each ztgi system is `ztgi launch` with `--dtype` and `--quantize` from its name:
`ztgi-<dtype>[-<quantize>]` (`ztgi-auto`, `ztgi-float32`, `ztgi-bfloat16-int8`, ...).

Every server is started and warmed up first (two-token requests at the largest level), then idles
while the others run. Each repeat runs every level on every system back to back, the systems'
order rotating from repeat to repeat, so a drift in the machine's speed hits all of them alike.
The load is `ztgi bench`'s load generator, streamed and greedy: ztgi through TGI's
`/generate_stream` (its OpenAI routes take no `ignore_eos`), llama-server through OpenAI's
`/v1/completions`; the same prompts and `max_new_tokens`, one SSE event per token on both. At
concurrency 1 only the first `--single-stream-requests` prompts run, each generating exactly its
`max_new_tokens` (many of the mixed prompts end at once at EOS, which leaves no TPOT to measure);
at the other levels EOS is respected unless `--ignore-eos`. Each request opens its own
connection, for every system alike.

Reported per system and level, as medians over the repeats: output tokens/s, TTFT p50, TPOT p50,
ITL p99, and the ratios issue 23 sets against llama-server (3x the tokens/s and at most half the
TTFT p50 and a lower ITL p99 at each throughput level, a TPOT p50 at one stream at most
llama-server's). The machine's load average before each run goes into the JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shlex
import statistics
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import aiohttp

from ztgi.bench.baseline_run import write_results
from ztgi.bench.baseline_setup import parse_workload
from ztgi.bench.bench import run_event_loop
from ztgi.bench.config import BenchConfig, parse_sweep
from ztgi.bench.launched_server import LaunchedServer, ServerStartError
from ztgi.bench.llama_server import LlamaServer, server_flags
from ztgi.bench.load_generator import READ_BUFFER_BYTES, LoadGenerator, RunResult
from ztgi.bench.workload import Prompt
from ztgi.common.config import ConfigError, require
from ztgi.common.model_source import DEFAULT_MODEL_ID, EMBEDDED_NAME, embedded_gguf_path

logger = logging.getLogger(__name__)

LLAMA = "llama-server"
DTYPES = ("auto", "float32", "bfloat16")
QUANTIZE = ("auto", "none", "gguf", "int8", "int4")
MIN_THROUGHPUT_RATIO = 3.0
MAX_TTFT_RATIO = 0.5
MAX_ITL_P99_RATIO = 1.0
MAX_TPOT_RATIO = 1.0
MAX_MEMORY_RATIO = 1.5


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class LlamaCppConfig:
    """ztgi systems and llama-server on the same GGUF and workload, side by side."""

    llama_server: str = dataclasses.field(default="", metadata=_help("path of the llama-server binary (required)"))
    systems: str = dataclasses.field(default="ztgi-auto", metadata=_help(
        "ztgi systems, comma-separated: ztgi-<auto|float32|bfloat16>[-<int8|int4>]; llama-server always runs"))
    model_id: str = dataclasses.field(default=DEFAULT_MODEL_ID, metadata=_help(
        "ztgi's model: `smollm2` (embedded) or a .gguf file; llama-server gets the same GGUF"))
    dataset: str = dataclasses.field(default="mixed", metadata=_help(
        "JSONL of {prompt, max_new_tokens}, or a built-in set: mixed, prefill-heavy"))
    output_tokens: int | None = dataclasses.field(default=None, metadata=_help("override every max_new_tokens"))
    max_requests: int | None = dataclasses.field(default=None, metadata=_help("only the first N prompts"))
    ignore_eos: bool = dataclasses.field(default=False, metadata=_help(
        "every request generates exactly its max_new_tokens (default: EOS respected)"))
    concurrencies: str = dataclasses.field(default="1,16", metadata=_help("levels; 1 is the single stream"))
    single_stream_requests: int = dataclasses.field(default=8, metadata=_help(
        "requests of the concurrency-1 level (the first N prompts)"))
    single_stream_ignore_eos: bool = dataclasses.field(default=True, metadata=_help(
        "at concurrency 1 every request generates its max_new_tokens, so TPOT is over the same tokens on both sides"))
    repeats: int = dataclasses.field(default=3, metadata=_help("runs of everything; figures are medians"))
    num_slots: int = dataclasses.field(default=16, metadata=_help("llama-server -np"))
    num_threads: int = dataclasses.field(default=2, metadata=_help("llama-server -t (the machine's cores)"))
    slot_context: int = dataclasses.field(default=2048, metadata=_help("llama-server context per slot"))
    prompt_cache: bool = dataclasses.field(default=False, metadata=_help(
        "both servers' prompt caches (ztgi's prefix caching, llama-server's cache_prompt); off: each repeat "
        "computes its prompts again"))
    llama_server_args: str = dataclasses.field(default="", metadata=_help("more llama-server flags, one string"))
    llama_as_ztgi_worker: bool = dataclasses.field(default=True, metadata=_help(
        "run llama-server at the priority ztgi's CPU worker takes (nice 10, SCHED_IDLE), so other work on "
        "the machine slows both alike; false: llama-server at normal priority"))
    startup_timeout_s: float = 600.0
    output: str | None = dataclasses.field(default=None, metadata=_help("write JSON results here"))
    plot: str | None = dataclasses.field(default=None, metadata=_help("write a PNG of the medians here"))
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        require(bool(self.llama_server), "--llama-server PATH (the llama-server binary) is required")
        for system in self.ztgi_systems:
            ztgi_flags(system)  # validates the names
        levels(self.concurrencies)
        require(self.single_stream_requests >= 1, "--single-stream-requests must be >= 1")
        require(self.repeats >= 1, "--repeats must be >= 1")
        require(self.num_slots >= 1 and self.num_threads >= 1 and self.slot_context >= 1,
                "--num-slots, --num-threads and --slot-context must be >= 1")
        require(self.model_id in (DEFAULT_MODEL_ID, EMBEDDED_NAME) or self.model_id.endswith(".gguf"),
                "--model-id must be `smollm2` or a .gguf file: llama-server serves GGUF only")

    @property
    def ztgi_systems(self) -> list[str]:
        return [s.strip() for s in self.systems.split(",") if s.strip()]

    @property
    def all_systems(self) -> list[str]:
        return [*self.ztgi_systems, LLAMA]

    def gguf(self) -> str:
        return self.model_id if self.model_id.endswith(".gguf") else embedded_gguf_path()


def levels(text: str) -> list[int]:
    try:
        return parse_sweep(text)
    except ConfigError:
        raise ConfigError(f"--concurrencies {text!r} must be comma-separated integers >= 1, e.g. 1,16") from None


def ztgi_flags(system: str) -> list[str]:
    """`ztgi-bfloat16-int8` -> `--dtype bfloat16 --quantize int8`; ConfigError for another name."""
    parts = system.split("-")
    valid = (len(parts) in (2, 3) and parts[0] == "ztgi" and parts[1] in DTYPES
             and (len(parts) == 2 or parts[2] in QUANTIZE))
    if not valid:
        raise ConfigError(f"system {system!r} must be ztgi-<{'|'.join(DTYPES)}>[-<{'|'.join(QUANTIZE[1:])}>]")
    return ["--dtype", parts[1], "--quantize", parts[2] if len(parts) == 3 else "auto"]


def launch_flags(config: LlamaCppConfig, system: str) -> list[str]:
    """`ztgi launch`'s flags for `system`: its dtype and quantization, the prompt cache as asked."""
    return ["--model-id", config.model_id, *ztgi_flags(system), "--log-level", config.log_level,
            "--prefix-caching" if config.prompt_cache else "--no-prefix-caching"]


@dataclasses.dataclass
class SystemRun:
    """One system at one level in one repeat, and the machine's load average when it started."""

    system: str
    concurrency: int
    repeat: int
    result: RunResult
    load_average: tuple[float, float, float]
    resident_bytes: int = 0  # the server's process tree right after the run

    def figures(self) -> dict[str, float | None]:
        s = self.result.summary
        return {"output_token_throughput": s.output_token_throughput, "ttft_p50_s": s.ttft_s.p50,
                "tpot_p50_s": s.tpot_s.p50, "itl_p99_s": s.itl_s.p99, "e2e_p50_s": s.e2e_s.p50,
                "num_output_tokens": s.num_output_tokens, "num_failures": s.num_failures,
                "duration_s": s.duration_s, "resident_mib": self.resident_bytes / 2**20 or None}

    def to_json(self) -> dict[str, Any]:
        return {"system": self.system, "concurrency": self.concurrency, "repeat": self.repeat,
                "load_average": self.load_average, "resident_bytes": self.resident_bytes, **self.result.to_json()}


class Table:
    """Medians over repeats, the ratios against llama-server, and the text table."""

    def __init__(self, runs: Sequence[SystemRun], systems: Sequence[str], concurrencies: Sequence[int]) -> None:
        self.runs = list(runs)
        self.systems = list(systems)
        self.concurrencies = list(concurrencies)

    def median(self, system: str, concurrency: int) -> dict[str, float | None] | None:
        repeats = [run.figures() for run in self.runs if (run.system, run.concurrency) == (system, concurrency)]
        if not repeats:
            return None
        return {name: _median([r[name] for r in repeats]) for name in repeats[0]}

    def ratio(self, system: str, concurrency: int, name: str) -> float | None:
        mine, theirs = self.median(system, concurrency), self.median(LLAMA, concurrency)
        numerator = None if mine is None else mine[name]
        denominator = None if theirs is None else theirs[name]
        if numerator is None or not denominator:
            return None
        return numerator / denominator

    def claims(self) -> list[dict[str, Any]]:
        claims = []
        for system in self.systems:
            if system == LLAMA:
                continue
            for level in self.concurrencies:
                if level == 1:
                    claims.append(_claim(f"{system}@1 TPOT p50 / llama", self.ratio(system, 1, "tpot_p50_s"),
                                         MAX_TPOT_RATIO, at_least=False))
                    continue
                claims += [
                    _claim(f"{system}@{level} tok/s / llama", self.ratio(system, level, "output_token_throughput"),
                           MIN_THROUGHPUT_RATIO, at_least=True),
                    _claim(f"{system}@{level} TTFT p50 / llama", self.ratio(system, level, "ttft_p50_s"),
                           MAX_TTFT_RATIO, at_least=False),
                    _claim(f"{system}@{level} ITL p99 / llama", self.ratio(system, level, "itl_p99_s"),
                           MAX_ITL_P99_RATIO, at_least=False, strict=True),
                    _claim(f"{system}@{level} resident memory / llama", self.ratio(system, level, "resident_mib"),
                           MAX_MEMORY_RATIO, at_least=False)]
        return claims

    def to_json(self) -> dict[str, Any]:
        medians = [{"system": system, "concurrency": level, **(self.median(system, level) or {})}
                   for level in self.concurrencies for system in self.systems]
        return {"medians": medians, "claims": self.claims()}

    def render_text(self) -> str:
        num_repeats = max((sum(1 for r in self.runs if (r.system, r.concurrency) == (s, c))
                           for s in self.systems for c in self.concurrencies), default=0)
        lines = [f"medians over {num_repeats} repeat(s); latencies in ms; x: against llama-server at that level",
                 f"{'system':<22}{'level':>6}{'tok/s':>9}{'x':>7}{'TTFT p50':>10}{'x':>7}{'TPOT p50':>10}{'x':>7}"
                 f"{'ITL p99':>10}{'x':>7}{'RSS MiB':>9}{'x':>7}{'tokens':>8}{'failed':>7}"]
        for level in self.concurrencies:
            for system in self.systems:
                m = self.median(system, level)
                if m is None:
                    continue
                lines.append(
                    f"{system:<22}{level:>6}{m['output_token_throughput']:>9.1f}"
                    f"{_x(self.ratio(system, level, 'output_token_throughput'))}{_ms(m['ttft_p50_s'])}"
                    f"{_x(self.ratio(system, level, 'ttft_p50_s'))}{_ms(m['tpot_p50_s'])}"
                    f"{_x(self.ratio(system, level, 'tpot_p50_s'))}{_ms(m['itl_p99_s'])}"
                    f"{_x(self.ratio(system, level, 'itl_p99_s'))}{_mib(m['resident_mib'])}"
                    f"{_x(self.ratio(system, level, 'resident_mib'))}{m['num_output_tokens']:>8.0f}"
                    f"{m['num_failures']:>7.0f}")
        lines += ["", f"{'target (issue 23)':<44}{'value':>8}{'bound':>9}  verdict"]
        for claim in self.claims():
            value = "-" if claim["value"] is None else f"{claim['value']:.2f}"
            sign = ">=" if claim["at_least"] else ("<" if claim["strict"] else "<=")
            verdict = {True: "PASS", False: "FAIL", None: "not measured"}[claim["passed"]]
            lines.append(f"{claim['name']:<44}{value:>8}{sign:>4} {claim['bound']:.2f}  {verdict}")
        return "\n".join(lines) + "\n"


def _claim(name: str, value: float | None, bound: float, at_least: bool, strict: bool = False) -> dict[str, Any]:
    if value is None:
        passed = None
    elif at_least:
        passed = value >= bound
    else:
        passed = value < bound if strict else value <= bound
    return {"name": name, "value": value, "bound": bound, "at_least": at_least, "strict": strict, "passed": passed}


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _ms(seconds: float | None) -> str:
    return f"{'-':>10}" if seconds is None else f"{seconds * 1000:>10.1f}"


def _mib(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value:>9.0f}"


def _x(ratio: float | None) -> str:
    return f"{'-':>7}" if ratio is None else f"{ratio:>7.2f}"


class Served(Protocol):
    """A server the runner loads: where it answers and what it holds in memory."""

    url: str

    def resident_bytes(self) -> int: ...


class Runner:
    """The servers, each warmed up, and the load generator pointed at each in turn."""

    def __init__(self, config: LlamaCppConfig, prompts: list[Prompt], servers: dict[str, Served]) -> None:
        self.config = config
        self.prompts = prompts
        self.servers = servers
        self.urls = {system: server.url for system, server in servers.items()}

    def warmup(self) -> None:
        width = max(levels(self.config.concurrencies))
        short = [dataclasses.replace(p, max_new_tokens=2) for p in self.prompts[:width]]
        for system in self.urls:
            logger.info("warming up %s", system)
            self._run(system, short, width, ignore_eos=True)

    def run_all(self) -> list[SystemRun]:
        runs = []
        systems = list(self.urls)
        for repeat in range(self.config.repeats):
            order = systems[repeat % len(systems):] + systems[:repeat % len(systems)]
            for level in levels(self.config.concurrencies):
                prompts = self.prompts[:self.config.single_stream_requests] if level == 1 else self.prompts
                for system in order:
                    load = os.getloadavg()
                    ignore_eos = self.config.ignore_eos or (level == 1 and self.config.single_stream_ignore_eos)
                    result = self._run(system, prompts, level, ignore_eos)
                    logger.info("repeat %d/%d %s@%d: %.1f tok/s, TTFT p50 %s ms, ITL p99 %s ms (load %.2f)",
                                repeat + 1, self.config.repeats, system, level,
                                result.summary.output_token_throughput, _ms(result.summary.ttft_s.p50).strip(),
                                _ms(result.summary.itl_s.p99).strip(), load[0])
                    runs.append(SystemRun(system, level, repeat, result, load, self.servers[system].resident_bytes()))
        return runs

    def _run(self, system: str, prompts: list[Prompt], concurrency: int, ignore_eos: bool) -> RunResult:
        api = "openai-completions" if system == LLAMA else "tgi"  # ztgi's OpenAI API has no ignore_eos
        bench = BenchConfig(backend=api, url=self.urls[system], model="default",
                            dataset=self.config.dataset, num_requests=len(prompts), ignore_eos=ignore_eos,
                            progress=False)
        return run_event_loop(self._run_fresh_connections(LoadGenerator(bench, prompts), concurrency))

    @staticmethod
    async def _run_fresh_connections(generator: LoadGenerator, concurrency: int) -> RunResult:
        """A connection per request for every system: llama-server (cpp-httplib) closes a
        connection idle for 5 s, and a pooled one reused after that fails as "Server disconnected"."""
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=generator.config.request_timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                         read_bufsize=READ_BUFFER_BYTES) as session:
            return await generator.run_in(session, concurrency)


def run_comparison(config: LlamaCppConfig, prompts: list[Prompt]) -> tuple[list[SystemRun], dict[str, Any]]:
    with contextlib.ExitStack() as stack:
        servers: dict[str, Served] = {}
        for system in config.ztgi_systems:
            server = LaunchedServer(launch_flags(config, system), config.startup_timeout_s)
            servers[system] = stack.enter_context(server)
        llama = LlamaServer(config.llama_server, server_flags(
            config.gguf(), config.num_slots, config.num_threads, config.slot_context, config.prompt_cache,
            shlex.split(config.llama_server_args)), config.startup_timeout_s,
            nice=10 if config.llama_as_ztgi_worker else 0, idle_class=config.llama_as_ztgi_worker)
        servers[LLAMA] = stack.enter_context(llama)
        about = {"llama_server_version": llama.version(), "llama_server_flags": llama.flags, "gguf": config.gguf(),
                 "cpu_count": os.cpu_count(), "load_average_at_start": os.getloadavg()}
        runner = Runner(config, prompts, servers)
        runner.warmup()
        return runner.run_all(), about


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when every run completed, 1 when a server failed to start or requests failed, 2 for a bad flag."""
    setup = parse_workload(LlamaCppConfig, argv, "llama-cpp")
    if setup is None:
        return 2
    config, prompts = setup
    try:
        runs, about = run_comparison(config, prompts)
    except ServerStartError as exc:
        logger.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        logger.warning("interrupted: no results")
        return 130
    table = Table(runs, config.all_systems, levels(config.concurrencies))
    sys.stdout.write(table.render_text())
    if config.output:
        write_results(config.output, {"config": dataclasses.asdict(config), **about, **table.to_json(),
                                      "runs": [run.to_json() for run in runs]})
        logger.info("wrote %s", config.output)
    if config.plot:
        write_plot(config.plot, table)
        logger.info("wrote %s", config.plot)
    return 1 if any(run.result.summary.num_failures for run in runs) else 0


PANELS = (("output_token_throughput", 1.0, "output tok/s (higher is better)"),
          ("ttft_p50_s", 1000.0, "TTFT p50, ms"), ("itl_p99_s", 1000.0, "ITL p99, ms"),
          ("tpot_p50_s", 1000.0, "TPOT p50, ms"))


def write_plot(path: str, table: Table) -> None:
    """One panel per figure: a bar per system, grouped by level (matplotlib, a dev extra)."""
    import matplotlib
    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 4.2))
    width = 0.8 / len(table.systems)
    for axis, (name, scale, title) in zip(axes, PANELS):
        for index, system in enumerate(table.systems):
            values = [(table.median(system, level) or {}).get(name) for level in table.concurrencies]
            positions = [i + index * width for i in range(len(table.concurrencies))]
            axis.bar(positions, [0 if v is None else v * scale for v in values], width, label=system)
        axis.set_xticks([i + width * (len(table.systems) - 1) / 2 for i in range(len(table.concurrencies))],
                        [f"{level} in flight" for level in table.concurrencies])
        axis.set_title(title)
    axes[0].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


if __name__ == "__main__":
    sys.exit(main())
