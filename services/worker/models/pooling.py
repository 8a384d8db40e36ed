"""How a served model turns a prompt's final hidden states into one embedding.

Decoder embedding models (Qwen3-Embedding, gte-Qwen2, e5-mistral) take the last token's hidden state,
after the final norm, and L2-normalise it: that is the default, with no flag. A sentence-transformers
model ships its choice in `1_Pooling/config.json`, which selects mean or CLS (first token) pooling
instead; a pooling mode not computed here (max, weighted mean...) leaves the model unable to embed,
with the reason. A config declaring `is_matryoshka` or `matryoshka_dimensions` (as vLLM reads it)
allows a client's `dimensions` to truncate the vector.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

POOLING_CONFIG = os.path.join("1_Pooling", "config.json")
_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
_UNSERVED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")


@dataclasses.dataclass(frozen=True)
class Pooling:
    """`mode` last, mean or cls; None where the model cannot be pooled here, `error` saying why."""

    mode: str | None = "last"
    error: str | None = None
    matryoshka: bool = False


def read_pooling(model_dir: str, config: Any) -> Pooling:
    """The pooling of the model in `model_dir` (its transformers `config` for Matryoshka)."""
    matryoshka = bool(getattr(config, "is_matryoshka", False) or getattr(config, "matryoshka_dimensions", None))
    path = os.path.join(model_dir, POOLING_CONFIG)
    if not os.path.isfile(path):
        return Pooling("last", None, matryoshka)
    try:
        with open(path, encoding="utf-8") as file:
            return dataclasses.replace(pooling_of(json.load(file)), matryoshka=matryoshka)
    except (OSError, ValueError) as exc:
        return Pooling(None, f"{POOLING_CONFIG} could not be read: {exc}")


def pooling_of(settings: Any) -> Pooling:
    """The pooling a sentence-transformers `1_Pooling/config.json` selects: exactly one mode of
    last, mean or cls, else None and why."""
    if not isinstance(settings, dict):
        return Pooling(None, f"{POOLING_CONFIG} is not a JSON object")
    unserved = [name for name in _UNSERVED if settings.get(name)]
    if unserved:
        return Pooling(None, f"{POOLING_CONFIG} asks for {', '.join(unserved)}; ztgi pools by last token, "
                             f"mean or CLS token only")
    modes = [mode for name, mode in _MODES.items() if settings.get(name)]
    if len(modes) != 1:
        return Pooling(None, f"{POOLING_CONFIG} must select exactly one of {', '.join(_MODES)}, got "
                             f"{len(modes)}")
    return Pooling(modes[0])
