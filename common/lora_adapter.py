"""A LoRA adapter directory in PEFT's format, read and checked without loading its weights.

PEFT (the library adapters are trained with) saves `adapter_config.json` and
`adapter_model.safetensors`: per adapted linear `W` (out x in) of a decoder layer, `lora_A` (r x in)
and `lora_B` (out x r), so that the adapted layer computes `x W^T + scale * (x A^T) B^T` with
`scale = lora_alpha / r`, or `lora_alpha / sqrt(r)` under rsLoRA, per module where `rank_pattern` or
`alpha_pattern` override them. The scheduler reads only the file's header (names and shapes) to
check an adapter against the base model's linears before any request uses it; each worker loads the
tensors (`services/worker/lora/adapter_weights.py`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_TENSOR_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:[\w.]*\.)?(\w+)\.lora_([AB])\.weight$")
_REFUSED_OPTIONS = {  # config key -> (value that is fine, why another is refused)
    "use_dora": (False, "DoRA adapters (use_dora) are not served"),
    "bias": ("none", "adapters that train biases (bias other than 'none') are not served"),
    "fan_in_fan_out": (False, "fan_in_fan_out adapters (GPT-2's Conv1D layers) are not served"),
}


class AdapterError(ValueError):
    """An adapter that cannot be served, and why."""


@dataclasses.dataclass(frozen=True)
class AdapterModule:
    """One adapted linear of one layer: its rank, PEFT's scale, and the shapes of A and B."""

    layer: int
    module: str  # PEFT's module name: q_proj, o_proj, gate_up_proj...
    rank: int
    scale: float
    in_features: int
    out_features: int


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
    """What the header and config say: every adapted module, by (layer, module)."""

    path: str
    modules: dict[tuple[int, str], AdapterModule]
    tensor_names: dict[tuple[int, str], tuple[str, str]]  # (layer, module) -> names of A and B

    @property
    def rank(self) -> int:
        return max(m.rank for m in self.modules.values())

    @property
    def targets(self) -> set[str]:
        return {module for _, module in self.modules}


def read_adapter(path: str, max_rank: int) -> AdapterSpec:
    """The adapter in directory `path`, its config and tensor shapes checked; AdapterError naming
    what is wrong (a missing file, a malformed config, a rank above `max_rank`, a tensor it cannot
    serve)."""
    config = _config(path)
    shapes = _header_shapes(path)
    pairs = _pairs(shapes)
    modules = {}
    for key, (a_name, b_name) in pairs.items():
        a_shape, b_shape = shapes[a_name], shapes[b_name]
        rank = a_shape[0]
        if len(a_shape) != 2 or len(b_shape) != 2 or b_shape[1] != rank:
            raise AdapterError(f"{a_name} {list(a_shape)} and {b_name} {list(b_shape)} are not a rank-r pair "
                               "(A is r x in, B is out x r)")
        if not 0 < rank <= max_rank:
            raise AdapterError(f"{a_name} has rank {rank}, above --max-lora-rank {max_rank}")
        modules[key] = AdapterModule(key[0], key[1], rank, _scale(config, a_name, rank), a_shape[1], b_shape[0])
    return AdapterSpec(path, modules, pairs)


def check_fits(spec: AdapterSpec, targets: Mapping[str, list[int]], num_layers: int) -> None:
    """AdapterError unless every adapted module is a linear of the base model, of its shape
    (`targets`: module name -> [in_features, out_features], over `num_layers` layers)."""
    if not targets:
        raise AdapterError("the workers serve no LoRA adapters (the paged engine's native forwards do)")
    for (layer, module), m in sorted(spec.modules.items()):
        if module not in targets:
            raise AdapterError(f"the adapter targets {module!r}, which the base model's layers do not have as a "
                               f"linear (they have {', '.join(sorted(targets))})")
        if layer >= num_layers:
            raise AdapterError(f"the adapter has weights for layer {layer}; the base model has {num_layers} layers")
        expected = targets[module]
        if [m.in_features, m.out_features] != list(expected):
            raise AdapterError(f"layer {layer} {module}: the adapter is {m.in_features} -> {m.out_features}, the "
                               f"base model's is {expected[0]} -> {expected[1]}: an adapter for another base model")


def parse_adapter_list(value: str | None) -> dict[str, str]:
    """`name=path,name=path` (TGI's --lora-adapters) as {name: path}; AdapterError when malformed."""
    adapters: dict[str, str] = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        name, sep, path = item.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise AdapterError(f"--lora-adapters entry {item!r} is not name=path")
        if name in adapters:
            raise AdapterError(f"--lora-adapters names {name!r} twice")
        adapters[name] = path
    return adapters


def _config(path: str) -> dict:
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise AdapterError(f"{path!r} is not a directory (an adapter is a directory with {CONFIG_FILE} and "
                           f"{WEIGHTS_FILE})")
    try:
        with open(config_path, encoding="utf-8") as file:
            config = json.load(file)
    except FileNotFoundError:
        raise AdapterError(f"{config_path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{config_path} is not a JSON file: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{config_path} is not a JSON object")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"{config_path}: peft_type {config.get('peft_type')!r} is not LORA")
    for key, (fine, why) in _REFUSED_OPTIONS.items():
        if config.get(key, fine) not in (fine, None):
            raise AdapterError(f"{config_path}: {why}")
    if config.get("modules_to_save"):
        raise AdapterError(f"{config_path}: adapters with fully trained modules (modules_to_save) are not served")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise AdapterError(f"{config_path}: lora_alpha must be a number, got {alpha!r}")
    return config


def _header_shapes(path: str) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    weights_path = os.path.join(path, WEIGHTS_FILE)
    if not os.path.exists(weights_path):
        legacy = os.path.exists(os.path.join(path, "adapter_model.bin"))
        raise AdapterError(f"{weights_path} does not exist" + (
            " (adapter_model.bin, a pickle, is not loaded: save with safe_serialization=True)" if legacy else ""))
    try:
        with safe_open(weights_path, framework="pt") as file:
            return {name: tuple(file.get_slice(name).get_shape()) for name in file.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise AdapterError(f"{weights_path} is not a safetensors file: {exc}") from None


def _pairs(shapes: Mapping[str, tuple[int, ...]]) -> dict[tuple[int, str], tuple[str, str]]:
    """(layer, module) -> the names of its A and B; AdapterError for a tensor of another kind
    (embedding LoRA, DoRA magnitudes, trained biases) or a half pair."""
    found: dict[tuple[int, str], dict[str, str]] = {}
    for name in shapes:
        match = _TENSOR_NAME.search(name)
        if match is None:
            raise AdapterError(f"tensor {name!r} is not a decoder layer's lora_A or lora_B weight: only LoRA on the "
                               "layers' linear projections is served")
        layer, module, half = int(match.group(1)), match.group(2), match.group(3)
        found.setdefault((layer, module), {})[half] = name
    if not found:
        raise AdapterError("the adapter has no lora_A/lora_B weights")
    for (layer, module), halves in found.items():
        if set(halves) != {"A", "B"}:
            raise AdapterError(f"layer {layer} {module} has lora_{next(iter(halves))} without its other half")
    return {key: (halves["A"], halves["B"]) for key, halves in found.items()}


def _scale(config: Mapping, tensor_name: str, rank: int) -> float:
    """PEFT's scaling of one module: its alpha (alpha_pattern, else lora_alpha) over its rank, or
    over the rank's square root with use_rslora."""
    alpha = float(config.get("lora_alpha", 8))
    module_path = tensor_name.rsplit(".lora_", 1)[0]
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.fullmatch(rf"(.*\.)?{pattern}", module_path):
            alpha = float(value)
            break
    return alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
