"""`SamplingParams`: vLLM's names and defaults for how `LLM.generate` decodes.

The fields mean what they mean in vLLM, so code written for `vllm.SamplingParams` runs here:
`temperature=0` is greedy (the default, 1.0, samples), `top_k=0` and `top_p=1` are off, `max_tokens`
defaults to 16 (None: up to the context, `max_total_tokens`), `stop` strings are left out of the text
unless `include_stop_str_in_output`. Each value is checked when the object is made; a bad one raises
ValueError naming the field and the value. `to_parameters` turns it into the `GenerateParameters`
the server's tokenizer takes from any client (TGI's fields), which the tokenizer's own code then
checks and resolves.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from ztgi.common.messages import GenerateParameters, TokenBias
from ztgi.common.parameters import MAX_SEED

MAX_LOGPROBS = 20
"""Top tokens per step `logprobs` may ask for (vLLM's default `max_logprobs`)."""

GREEDY_EPSILON = 1e-5
"""A temperature below this is greedy decoding (vLLM's `_SAMPLING_EPS`)."""


@dataclasses.dataclass
class SamplingParams:
    """How to decode one prompt's `n` sequences (vLLM's field names and defaults)."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    truncate_prompt_tokens: int | None = None
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        self.stop = _stop_list(self.stop)
        self._check_types()
        self._check_ranges()

    @property
    def stop_strings(self) -> list[str]:
        """`stop` as the list it is once constructed (it is given as a string, a list or None)."""
        return _stop_list(self.stop)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON

    def to_parameters(self, index: int = 0) -> GenerateParameters:
        """TGI's parameters of sequence `index` of the `n`: with a seed, sequence i samples with
        seed + i, so the n differ and each can be replayed alone."""
        greedy = self.greedy
        return GenerateParameters(
            max_new_tokens=self.max_tokens,
            temperature=None if greedy else self.temperature,
            top_k=None if greedy or self.top_k <= 0 else self.top_k,
            top_p=None if greedy or self.top_p >= 1.0 else self.top_p,
            do_sample=not greedy,
            seed=None if self.seed is None else (self.seed + index) % (MAX_SEED + 1),
            repetition_penalty=None if self.repetition_penalty == 1.0 else self.repetition_penalty,
            frequency_penalty=None if self.frequency_penalty == 0.0 else self.frequency_penalty,
            presence_penalty=None if self.presence_penalty == 0.0 else self.presence_penalty,
            stop=self.stop_strings,
            truncate=self.truncate_prompt_tokens,
            top_n_tokens=self.logprobs or None,
            decoder_input_details=self.prompt_logprobs is not None,
            ignore_eos=self.ignore_eos,
            logit_bias=[TokenBias(token_id, float(bias)) for token_id, bias in self.logit_bias.items()]
            if self.logit_bias else None,
        )

    # -- checks --------------------------------------------------------------------------------

    def _check_types(self) -> None:
        for name in ("n", "top_k"):
            _require_int(name, getattr(self, name))
        for name in ("seed", "max_tokens", "logprobs", "prompt_logprobs", "truncate_prompt_tokens"):
            if getattr(self, name) is not None:
                _require_int(name, getattr(self, name))
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("include_stop_str_in_output", "ignore_eos"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def _check_ranges(self) -> None:
        _require(self.n >= 1, f"n must be at least 1, got {self.n}")
        _require(-2.0 <= self.presence_penalty <= 2.0,
                 f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        _require(-2.0 <= self.frequency_penalty <= 2.0,
                 f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        _require(self.repetition_penalty > 0.0,
                 f"repetition_penalty must be greater than zero, got {self.repetition_penalty}")
        _require(self.temperature >= 0.0, f"temperature must be non-negative, got {self.temperature}")
        _require(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _require(self.top_k >= -1, f"top_k must be 0 or -1 (off), or at least 1, got {self.top_k}")
        _require(self.seed is None or 0 <= self.seed <= MAX_SEED, f"seed must be in [0, {MAX_SEED}], got {self.seed}")
        _require(self.max_tokens is None or self.max_tokens >= 1,
                 f"max_tokens must be at least 1, got {self.max_tokens}")
        _require(self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
                 f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        _require(self.prompt_logprobs in (None, 0),
                 f"prompt_logprobs must be None or 0 (each prompt token's own logprob; top tokens of the "
                 f"prompt are not computed), got {self.prompt_logprobs}")
        _check_logit_bias(self.logit_bias)
        _require(self.truncate_prompt_tokens is None or self.truncate_prompt_tokens >= 1,
                 f"truncate_prompt_tokens must be at least 1, got {self.truncate_prompt_tokens}")


def _stop_list(stop: object) -> list[str]:
    """`stop` as a list of non-empty strings (vLLM takes one string or a list)."""
    if stop is None:
        return []
    sequences = [stop] if isinstance(stop, str) else stop
    if not isinstance(sequences, (list, tuple)) or not all(isinstance(s, str) for s in sequences):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    if not all(sequences):
        raise ValueError(f"stop strings must not be empty, got {stop!r}")
    return list(sequences)


def _require_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_logit_bias(logit_bias: dict[int, float] | None) -> None:
    """vLLM's `logit_bias`: {token id: bias}, each bias within OpenAI's [-100, 100]."""
    if logit_bias is None:
        return
    _require(isinstance(logit_bias, dict), f"logit_bias must be a dict of token id to bias, got {logit_bias!r}")
    for token_id, bias in logit_bias.items():
        _require(type(token_id) is int and token_id >= 0, f"logit_bias keys must be token ids >= 0, got {token_id!r}")
        _require(not isinstance(bias, bool) and isinstance(bias, numbers.Real) and math.isfinite(bias)
                 and -100 <= bias <= 100, f"logit_bias values must be in [-100, 100], got {bias!r} for {token_id}")
