"""What a request asks of the generation: as a client sends it, and as a worker samples by it."""

from __future__ import annotations

from ztgi.common.codec import record
from ztgi.common.messages.chat import Grammar

__all__ = ["GenerateParameters", "SamplingParameters", "TokenBias"]


@record
class TokenBias:
    """OpenAI's `logit_bias` entry: `bias` (-100..100) added to the token's logit before choosing."""

    token_id: int
    bias: float


@record
class GenerateParameters:
    """TGI's generation parameters as a client sends them (None: the server default).

    Ranges are checked by the gateway (HTTP 422) and again by the tokenizer for direct clients.
    """

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    do_sample: bool = False
    seed: int | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    watermark: bool = False
    stop: list[str] = ()  # type: ignore[assignment]
    truncate: int | None = None
    details: bool = False
    decoder_input_details: bool = False
    top_n_tokens: int | None = None
    return_full_text: bool = False
    ignore_eos: bool = False
    add_special_tokens: bool = True
    presence_penalty: float | None = None  # OpenAI's; last so the older fields keep their places
    grammar: Grammar | None = None
    logit_bias: list[TokenBias] | None = None  # OpenAI's
    embed: bool = False  # /v1/embeddings: one prefill whose pooled hidden state is the answer (max_new_tokens 1)
    adapter_id: str | None = None  # TGI's: the LoRA adapter to generate with, by name (unknown: refused)
    model: str | None = None  # OpenAI's `model`: an adapter's name selects that adapter; any other, the base model

    def __post_init__(self) -> None:
        if isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", list(self.stop))


@record
class SamplingParameters:
    """How a worker chooses the next token for one request (TGI's NextTokenChooserParameters).

    Applied in TGI's order: watermark, repetition penalty, frequency penalty (then OpenAI's
    presence penalty and logit bias), the grammar's mask, then temperature, top_k, top_p, typical_p;
    greedy unless do_sample.
    Neutral values leave logits untouched.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    do_sample: bool = False
    seed: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    watermark: bool = False
    presence_penalty: float = 0.0  # last: added after the others, the older fields keep their places
    grammar: Grammar | None = None  # the grammar mask comes after the penalties, before temperature
    logit_bias: list[TokenBias] | None = None  # after the penalties, before the grammar's mask
