"""Generation parameters: TGI's validation rules and messages, and resolution to sampling.

Both the gateway (HTTP 422 before anything is queued) and the tokenizer (for direct ZMQ
clients) call `validate_parameters`; the tokenizer then calls `resolve_sampling` to turn what a
client sent into what a worker runs. The messages are TGI's (router `validation.rs`) so clients
written against TGI see the same text.
"""

from __future__ import annotations

import dataclasses
import math
import secrets

from ztgi.common.messages.parameters import GenerateParameters, SamplingParameters
from ztgi.common.request_limit import (
    MAX_BEST_OF,
    MAX_INPUT_TOKENS,
    MAX_STOP_SEQUENCES,
    MAX_TOP_N_TOKENS,
    MAX_TOTAL_TOKENS,
)

MAX_SEED = 2**64 - 1
"""TGI seeds are u64."""

MAX_LOGIT_BIAS = 100.0
"""OpenAI's bound on a `logit_bias` value, either sign."""

_RANDOM_SEED_BITS = 63  # a drawn seed stays a signed 64-bit integer everywhere it travels


class ValidationError(ValueError):
    """A parameter a client sent is invalid; `str(e)` is TGI's message, `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclasses.dataclass(frozen=True)
class ParameterLimits:
    """Server limits a request is checked against (TGI launcher defaults, declared in `request_limit`)."""

    max_best_of: int = MAX_BEST_OF.field()
    max_stop_sequences: int = MAX_STOP_SEQUENCES.field()
    max_top_n_tokens: int = MAX_TOP_N_TOKENS.field()
    max_input_tokens: int = MAX_INPUT_TOKENS.field()
    max_total_tokens: int = MAX_TOTAL_TOKENS.field()


def validate_parameters(params: GenerateParameters, limits: ParameterLimits) -> None:
    """Raises ValidationError for the first parameter out of TGI's ranges."""
    _validate_sampling(params)
    _validate_stopping(params, limits)
    _validate_details(params, limits)


def validate_best_of(best_of: int | None, params: GenerateParameters, limits: ParameterLimits,
                     stream: bool) -> int:
    """TGI's `best_of` rules; returns how many sequences to generate (1 when unset).

    `best_of` is served by the gateway (several seeded requests, the likeliest returned), so it
    never travels on the wire; the rules and messages are TGI's.
    """
    if best_of is None or best_of == 1:
        return 1
    if limits.max_best_of == 1:
        raise ValidationError("best_of", "`best_of` != 1 is not allowed for this endpoint")
    if not 0 < best_of <= limits.max_best_of:
        raise ValidationError("best_of", f"`best_of` must be > 0 and <= {limits.max_best_of}. Given: {best_of}")
    if stream:
        raise ValidationError("best_of", "`best_of` != 1 is not supported when streaming tokens")
    if not is_sampling(params):
        raise ValidationError("best_of", "you must use sampling when `best_of` is > 1")
    if params.seed is not None:
        raise ValidationError("seed", "`seed` must not be set when `best_of` > 1")
    return best_of


def is_sampling(params: GenerateParameters) -> bool:
    """TGI's test for `best_of`: sampling asked for, or any warper given."""
    warpers = (params.temperature, params.top_k, params.top_p, params.typical_p)
    return params.do_sample or any(value is not None for value in warpers)


def resolve_sampling(params: GenerateParameters) -> SamplingParameters:
    """TGI's resolution: neutral defaults, sampling when asked or any warper is non-neutral,
    and a random seed when sampling without one (reported back in the details)."""
    temperature = 1.0 if params.temperature is None else float(params.temperature)
    top_k = params.top_k or 0
    top_p = 1.0 if params.top_p is None else float(params.top_p)
    typical_p = 1.0 if params.typical_p is None else float(params.typical_p)
    has_warpers = temperature != 1.0 or top_k != 0 or top_p < 1.0 or typical_p < 1.0
    do_sample = bool(params.do_sample or has_warpers)
    return SamplingParameters(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        typical_p=typical_p,
        do_sample=do_sample,
        seed=_resolve_seed(params.seed, do_sample),
        repetition_penalty=1.0 if params.repetition_penalty is None else float(params.repetition_penalty),
        frequency_penalty=0.0 if params.frequency_penalty is None else float(params.frequency_penalty),
        watermark=params.watermark,
        presence_penalty=0.0 if params.presence_penalty is None else float(params.presence_penalty),
        grammar=params.grammar,
        logit_bias=params.logit_bias or None,
    )


def _resolve_seed(seed: int | None, do_sample: bool) -> int:
    if seed is not None:
        return seed
    return secrets.randbits(_RANDOM_SEED_BITS) if do_sample else 0


def _validate_sampling(params: GenerateParameters) -> None:
    if params.temperature is not None and not _positive(params.temperature):
        raise ValidationError("temperature", "`temperature` must be strictly positive")
    if params.repetition_penalty is not None and not _positive(params.repetition_penalty):
        raise ValidationError("repetition_penalty", "`repetition_penalty` must be strictly positive")
    if params.frequency_penalty is not None and not -2.0 <= params.frequency_penalty <= 2.0:
        raise ValidationError("frequency_penalty", "`frequency_penalty` must be >= -2.0 and <= 2.0")
    if params.presence_penalty is not None and not -2.0 <= params.presence_penalty <= 2.0:
        raise ValidationError("presence_penalty", "`presence_penalty` must be >= -2.0 and <= 2.0")
    if params.top_p is not None and not 0.0 < params.top_p < 1.0:
        raise ValidationError("top_p", "`top_p` must be > 0.0 and < 1.0")
    if params.typical_p is not None and not 0.0 < params.typical_p < 1.0:
        raise ValidationError("typical_p", "`typical_p` must be > 0.0 and < 1.0")
    if params.top_k is not None and params.top_k <= 0:
        raise ValidationError("top_k", "`top_k` must be strictly positive")
    if params.seed is not None and not 0 <= params.seed <= MAX_SEED:
        raise ValidationError("seed", f"`seed` must be >= 0 and <= {MAX_SEED}. Given: {params.seed}")
    for entry in params.logit_bias or ():
        if entry.token_id < 0:
            raise ValidationError("logit_bias", f"`logit_bias` keys must be token ids >= 0. Given: {entry.token_id}")
        if not (math.isfinite(entry.bias) and -MAX_LOGIT_BIAS <= entry.bias <= MAX_LOGIT_BIAS):
            raise ValidationError("logit_bias", f"`logit_bias` values must be >= -100 and <= 100. "
                                                f"Given: {entry.bias} for token {entry.token_id}")


def _validate_stopping(params: GenerateParameters, limits: ParameterLimits) -> None:
    if params.max_new_tokens is not None and params.max_new_tokens <= 0:
        raise ValidationError("max_new_tokens", "`max_new_tokens` must be strictly positive")
    if len(params.stop) > limits.max_stop_sequences:
        raise ValidationError(
            "stop",
            f"`stop` supports up to {limits.max_stop_sequences} stop sequences. Given: {len(params.stop)}")
    if any(not sequence for sequence in params.stop):
        raise ValidationError("stop", "`stop` sequences must not be empty")
    if params.truncate is not None and not 0 < params.truncate <= limits.max_input_tokens:
        raise ValidationError(
            "truncate",
            f"`truncate` must be strictly positive and less than {limits.max_input_tokens}. "
            f"Given: {params.truncate}")


def _validate_details(params: GenerateParameters, limits: ParameterLimits) -> None:
    if params.top_n_tokens is not None and not 0 <= params.top_n_tokens <= limits.max_top_n_tokens:
        raise ValidationError(
            "top_n_tokens",
            f"`top_n_tokens` must be >= 0 and <= {limits.max_top_n_tokens}. Given: {params.top_n_tokens}")


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0.0


def validate_lengths(num_input_tokens: int, max_new_tokens: int, limits: ParameterLimits) -> None:
    """TGI's length checks on an encoded prompt, in TGI's order (total first, then input)."""
    if num_input_tokens + max_new_tokens > limits.max_total_tokens:
        raise ValidationError(
            "max_new_tokens",
            f"`inputs` tokens + `max_new_tokens` must be <= {limits.max_total_tokens}. "
            f"Given: {num_input_tokens} `inputs` tokens and {max_new_tokens} `max_new_tokens`")
    if num_input_tokens > limits.max_input_tokens:
        raise ValidationError(
            "inputs",
            f"`inputs` must have less than {limits.max_input_tokens} tokens. Given: {num_input_tokens}")
