"""OpenAI's embeddings request (`POST /v1/embeddings`) checked and turned into one request per input.

`input` is a string, an array of strings, an array of token ids or an array of arrays of token ids
(as the openai SDK sends after its own tokenization), never a mix; the inputs of one request count
against `max_client_batch_size`. `encoding_format` is float (default) or base64 (little-endian
float32, what the SDK decodes). `dimensions` truncates and re-normalises where the model declares
Matryoshka training; otherwise only the model's own size is accepted. `user` is accepted and
unused; vLLM's `truncate_prompt_tokens` (keep the last N tokens) and `add_special_tokens` are
taken; any other field is refused, never silently ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ztgi.common.messages import GenerateParameters, InfoReply
from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.errors import HttpError
from ztgi.services.gateway.schemas import json_type, optional_integer, optional_value
from ztgi.services.gateway.text_or_token_ids import TextOrTokenIds, text_or_token_ids

ENCODING_FORMATS = ("float", "base64")
_FIELDS = {"input", "model", "encoding_format", "dimensions", "user", "truncate_prompt_tokens", "add_special_tokens"}

EmbeddingInput = TextOrTokenIds
"""One input: text, or token ids."""


@dataclasses.dataclass(frozen=True)
class EmbeddingRequest:
    """What to embed and how to answer."""

    model: str
    inputs: list[EmbeddingInput]
    encoding_format: str = "float"
    dimensions: int | None = None
    truncate: int | None = None
    add_special_tokens: bool = True

    @property
    def parameters(self) -> GenerateParameters:
        """Each input's request: one prefill whose pooled hidden state is the answer."""
        return GenerateParameters(max_new_tokens=1, embed=True, truncate=self.truncate,
                                  add_special_tokens=self.add_special_tokens)


def parse_embedding_request(body: Any, max_client_batch_size: int) -> EmbeddingRequest:
    """The checked request; ValidationError (422) naming the field."""
    if not isinstance(body, dict):
        raise ValidationError("body", f"the request body must be a JSON object, got {json_type(body)}")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise ValidationError(unknown[0], f"unsupported field(s) {', '.join(f'`{name}`' for name in unknown)}: "
                                          f"/v1/embeddings takes {', '.join(sorted(_FIELDS))}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ValidationError("model", f"`model` must be the served model's id, got {json_type(model)}")
    optional_value(body, "user", str, "a string")
    encoding_format = optional_value(body, "encoding_format", str, "a string") or "float"
    if encoding_format not in ENCODING_FORMATS:
        raise ValidationError("encoding_format", f"`encoding_format` must be float or base64, got {encoding_format!r}")
    return EmbeddingRequest(model, _inputs(body.get("input"), max_client_batch_size), encoding_format,
                            _positive(body, "dimensions"), _positive(body, "truncate_prompt_tokens"),
                            _add_special_tokens(body))


def check_servable(request: EmbeddingRequest, info: InfoReply) -> None:
    """The request names the served model (404 otherwise), the model pools, and `dimensions` is one
    it can give (422)."""
    if request.model != info.model_id:
        raise HttpError(404, f"The model `{request.model}` does not exist (this server serves `{info.model_id}`)",
                        "model_not_found")
    if info.pooling is None:
        raise ValidationError("model", f"`{info.model_id}` cannot be pooled into embeddings: "
                                       f"{info.pooling_error or 'its workers return no hidden states'}")
    dimensions = request.dimensions
    if dimensions is None or dimensions == info.hidden_size:
        return
    if not info.matryoshka:
        raise ValidationError("dimensions", f"`dimensions` {dimensions}: `{info.model_id}` gives embeddings of "
                                            f"{info.hidden_size} dimensions and does not declare Matryoshka "
                                            f"training (is_matryoshka or matryoshka_dimensions in its config), "
                                            f"so it cannot shorten them")
    if dimensions > info.hidden_size:
        raise ValidationError("dimensions", f"`dimensions` must be at most {info.hidden_size}, the model's "
                                            f"embedding size, got {dimensions}")


def _inputs(raw: Any, max_client_batch_size: int) -> list[EmbeddingInput]:
    inputs = text_or_token_ids(raw, "input", "inputs")
    if len(inputs) > max_client_batch_size:
        raise ValidationError("input", f"`input` has {len(inputs)} inputs, more than the {max_client_batch_size} "
                                       f"of one request (--max-client-batch-size)")
    return inputs


def _positive(body: dict[str, Any], name: str) -> int | None:
    value = optional_integer(body, name)
    if value is not None and value < 1:
        raise ValidationError(name, f"`{name}` must be a positive integer, got {value}")
    return value


def _add_special_tokens(body: dict[str, Any]) -> bool:
    value = optional_value(body, "add_special_tokens", bool, "a boolean")
    return True if value is None else bool(value)
