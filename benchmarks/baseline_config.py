"""What every baseline shares: the workload and the model (flags `--x-y`, env `ZTGI_X_Y`)."""

from __future__ import annotations

import dataclasses

from ztgi.common.config import require
from ztgi.common.model_source import DEFAULT_MODEL_ID

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
QUANTIZE = ("none", "int8", "int4")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class BaselineConfig:
    """The workload (the same prompts `ztgi bench` sends) and the model that serves it.

    The prompts are encoded as ztgi's tokenizer encodes a TGI `inputs` string, decoding is
    greedy, and each request asks for its dataset `max_new_tokens` (or `--output-tokens`).
    """

    dataset: str = dataclasses.field(default="mixed", metadata=_help(
        "JSONL file of {prompt, max_new_tokens}, or `mixed` (built in)"))
    output_tokens: int | None = dataclasses.field(default=None, metadata=_help(
        "max_new_tokens of every request (overrides the dataset's values)"))
    max_requests: int | None = dataclasses.field(default=None, metadata=_help(
        "use only the first N prompts (default: the whole dataset)"))
    ignore_eos: bool = dataclasses.field(default=False, metadata=_help(
        "every request generates exactly its max_new_tokens"))
    model_id: str = dataclasses.field(default=DEFAULT_MODEL_ID, metadata=_help(
        "`smollm2` (embedded), a model directory, a .gguf file or a Hub id"))
    dtype: str = dataclasses.field(default="float32", metadata=_help(
        "float32, bfloat16, float16, or auto (the worker's choice: bfloat16 where the CPU or GPU runs it faster)"))
    device: str = dataclasses.field(default="auto", metadata=_help("auto, cpu or cuda"))
    backend: str = dataclasses.field(default="auto", metadata=_help(
        "the engine's forward (ztgi and the engine alone): native, transformers or auto; static batching "
        "always runs transformers' generate"))
    quantize: str = dataclasses.field(default="none", metadata=_help(
        "the engine's linear weights (ztgi and the engine alone, native forward): none, int8 or int4"))
    output: str | None = dataclasses.field(default=None, metadata=_help("write JSON results here"))
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        require(self.dtype in DTYPES, f"--dtype {self.dtype!r} must be one of {', '.join(DTYPES)}")
        require(self.quantize in QUANTIZE, f"--quantize {self.quantize!r} must be one of {', '.join(QUANTIZE)}")
        require(self.device in DEVICES, f"--device {self.device!r} must be one of {', '.join(DEVICES)}")
        for name in ("output_tokens", "max_requests"):
            value = getattr(self, name)
            require(value is None or value >= 1, f"--{name.replace('_', '-')} must be >= 1, got {value}")
