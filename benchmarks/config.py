"""Bench configuration (flags `--x-y`, environment `ZTGI_X_Y`)."""

from __future__ import annotations

import dataclasses

from ztgi.common.config import require

BACKEND_NAMES = ("tgi", "openai-completions", "openai-chat")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """`ztgi bench`: a streaming load generator for servers speaking the TGI or OpenAI API.

    The workload is `--dataset` (a JSONL file, or `mixed` for the built-in prompt set) or
    generated prompts of `--input-tokens` words asking for `--output-tokens` tokens. The load is
    closed (`--concurrency` requests in flight), open (`--request-rate` Poisson arrivals per
    second), or both (Poisson arrivals, at most `--concurrency` in flight).
    """

    backend: str = dataclasses.field(default="tgi", metadata=_help(
        "API to call: tgi (/generate_stream), openai-completions, openai-chat"))
    url: str = dataclasses.field(default="http://127.0.0.1:8080", metadata=_help("server base URL"))
    model: str = dataclasses.field(default="tgi", metadata=_help("`model` sent to the OpenAI APIs"))
    lora_adapters: str | None = dataclasses.field(default=None, metadata=_help(
        "LoRA adapter names, comma-separated: request i asks for name i mod n (`base`: the base model), as TGI's "
        "adapter_id or OpenAI's model"))
    dataset: str | None = dataclasses.field(default=None, metadata=_help(
        "JSONL file of {prompt, max_new_tokens}, or a built-in set: `mixed`, `prefill-heavy` (64 documents of 20-740 "
        "tokens, each with a short-answer instruction), `shared-prefix` (32 questions on one "
        "~1,500-token document), `multi-turn` (16 chats x 6 turns); unset: generated prompts"))
    input_tokens: int | None = dataclasses.field(default=None, metadata=_help(
        "generated prompt length in tokens (default 128)"))
    input_tokens_range: float = dataclasses.field(default=0.0, metadata=_help(
        "spread of generated prompt lengths: uniform in [N*(1-r), N*(1+r)], 0 <= r < 1"))
    output_tokens: int | None = dataclasses.field(default=None, metadata=_help(
        "max_new_tokens of every request (default 128; overrides the dataset's values)"))
    concurrency: int | None = dataclasses.field(default=None, metadata=_help(
        "requests in flight (closed loop); default 1 unless --request-rate is set"))
    request_rate: float | None = dataclasses.field(default=None, metadata=_help(
        "Poisson arrivals per second (open loop); unset: as fast as --concurrency allows"))
    sweep: str | None = dataclasses.field(default=None, metadata=_help(
        "comma-separated concurrencies to run one after the other, e.g. 1,4,16,32"))
    num_requests: int | None = dataclasses.field(default=None, metadata=_help(
        "requests per run (default: one pass over the dataset, or 100 generated prompts)"))
    duration_s: float | None = dataclasses.field(default=None, metadata=_help(
        "stop sending new requests after this many seconds"))
    ignore_eos: bool = dataclasses.field(default=False, metadata=_help(
        "ask the server to ignore EOS so every request generates its max_new_tokens"))
    temperature: float = dataclasses.field(default=0.0, metadata=_help("0 is greedy"))
    seed: int = dataclasses.field(default=0, metadata=_help("seed of prompts, arrivals and sampling"))
    request_timeout_s: float = dataclasses.field(default=600.0, metadata=_help("per request"))
    output: str | None = dataclasses.field(default=None, metadata=_help("write JSON results here"))
    plot: str | None = dataclasses.field(default=None, metadata=_help("write a PNG of the results here"))
    progress: bool = dataclasses.field(default=True, metadata=_help("progress bar on a terminal"))
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        require(self.backend in BACKEND_NAMES,
                f"--backend {self.backend!r} is unknown; use one of {', '.join(BACKEND_NAMES)}")
        require(self.url.startswith(("http://", "https://")),
                f"--url {self.url!r} must start with http:// or https://")
        require(self.dataset is None or self.input_tokens is None,
                "--input-tokens generates prompts; it cannot be combined with --dataset")
        for name in ("input_tokens", "output_tokens", "concurrency", "num_requests"):
            value = getattr(self, name)
            require(value is None or value >= 1, f"--{name.replace('_', '-')} must be >= 1, got {value}")
        require(0.0 <= self.input_tokens_range < 1.0,
                f"--input-tokens-range must be in [0, 1), got {self.input_tokens_range}")
        require(self.request_rate is None or self.request_rate > 0,
                f"--request-rate must be positive, got {self.request_rate}")
        require(self.duration_s is None or self.duration_s > 0,
                f"--duration-s must be positive, got {self.duration_s}")
        require(self.temperature >= 0, f"--temperature must be >= 0, got {self.temperature}")
        require(self.request_timeout_s > 0, "--request-timeout-s must be positive")
        if self.sweep is not None:
            require(self.concurrency is None, "--sweep replaces --concurrency; give one of them")
            parse_sweep(self.sweep)

    @property
    def concurrencies(self) -> list[int | None]:
        """One entry per run: the --sweep levels, or the single --concurrency (None: unbounded)."""
        if self.sweep is not None:
            return list(parse_sweep(self.sweep))
        if self.concurrency is None and self.request_rate is None:
            return [1]
        return [self.concurrency]


def parse_sweep(text: str) -> list[int]:
    """`1,4,16` as [1, 4, 16]; ConfigError unless every level is an integer >= 1."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        levels = []
    require(bool(levels) and all(level >= 1 for level in levels),
            f"--sweep {text!r} must be comma-separated integers >= 1, e.g. 1,4,16,32")
    return levels
