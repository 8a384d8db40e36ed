"""TGI's HTTP response schemas: results, stream events and server info as JSON objects."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ztgi.common.client.generate_result import GenerateResult
from ztgi.common.messages import FinalDetails, GenerateParameters, InfoReply, StreamEvent, Token
from ztgi.services.gateway.config import GatewayConfig

ROUTER_NAME = "ztgi"


def token_json(token: Token) -> dict[str, Any]:
    return {"id": token.id, "text": token.text, "logprob": _logprob(token), "special": token.special}


def prefill_token_json(token: Token) -> dict[str, Any]:
    return {"id": token.id, "text": token.text, "logprob": _logprob(token)}


def _logprob(token: Token) -> float | None:
    # the first prompt token has no logprob (NaN inside); JSON has no NaN, TGI sends null
    return token.logprob if token.logprob is not None and math.isfinite(token.logprob) else None


def generate_response(result: GenerateResult, parameters: GenerateParameters,
                      best_of_sequences: Sequence[GenerateResult] = ()) -> dict[str, Any]:
    """TGI's GenerateResponse: the text, and `details` when asked for (with the other
    sequences of a `best_of` request)."""
    response: dict[str, Any] = {"generated_text": result.text}
    if (parameters.details or parameters.decoder_input_details) and result.details is not None:
        response["details"] = details_json(result, result.details, parameters)
        if best_of_sequences:
            response["details"]["best_of_sequences"] = [
                best_of_sequence_json(other, parameters) for other in best_of_sequences]
    return response


def best_of_sequence_json(result: GenerateResult, parameters: GenerateParameters) -> dict[str, Any]:
    """TGI's BestOfSequence: one of the sequences `best_of` did not choose."""
    assert result.details is not None, "a best_of request asks for details"
    rendered = details_json(result, result.details, parameters)
    del rendered["best_of_sequences"]
    return {"generated_text": result.text, **rendered}


def details_json(result: GenerateResult, details: FinalDetails,
                 parameters: GenerateParameters) -> dict[str, Any]:
    """TGI's Details; `prefill` only with decoder_input_details, `top_tokens` with top_n_tokens."""
    rendered: dict[str, Any] = {
        "finish_reason": details.finish_reason,
        "generated_tokens": details.generated_tokens,
        "seed": details.seed,
        "cached_tokens": details.cached_tokens,
        "prefill": [prefill_token_json(t) for t in details.prefill] if parameters.decoder_input_details else [],
        "tokens": [token_json(t) for t in result.tokens],
        "best_of_sequences": None,
    }
    if parameters.top_n_tokens:
        rendered["top_tokens"] = [[token_json(t) for t in top] for top in result.top_tokens]
    return rendered


def stream_event_json(event: StreamEvent, index: int) -> dict[str, Any]:
    """TGI's StreamResponse for one event; the last carries the text and the details.

    TGI sends the last event's details only when asked; they are small and streaming clients
    want the finish reason, so they always come here (clients treat the field as optional).
    """
    details = None
    if event.details is not None:
        details = {
            "finish_reason": event.details.finish_reason,
            "generated_tokens": event.details.generated_tokens,
            "input_length": event.details.input_tokens,
            "seed": event.details.seed,
            "cached_tokens": event.details.cached_tokens,
        }
    return {
        "index": index,
        "token": token_json(event.token) if event.token is not None else None,
        "top_tokens": [token_json(t) for t in event.top_tokens],
        "generated_text": event.generated_text,
        "details": details,
    }


def info_json(info: InfoReply, config: GatewayConfig) -> dict[str, Any]:
    """TGI's Info: what the scheduler reports, plus what this gateway knows of itself."""
    return {
        "model_id": info.model_id,
        "model_sha": None,
        "model_dtype": info.model_dtype,
        "model_device_type": info.model_device_type,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": info.max_concurrent_requests,
        "max_best_of": info.max_best_of,
        "max_stop_sequences": info.max_stop_sequences,
        "max_input_tokens": info.max_input_tokens,
        "max_total_tokens": info.max_total_tokens,
        "waiting_served_ratio": info.waiting_served_ratio,
        "max_batch_total_tokens": info.max_batch_total_tokens,
        "max_batch_prefill_tokens": info.max_batch_prefill_tokens,
        "max_waiting_tokens": info.max_waiting_tokens,
        "max_batch_size": info.max_batch_size,
        "validation_workers": info.num_tokenizers,
        "max_client_batch_size": config.max_client_batch_size,
        "router": ROUTER_NAME,
        "version": info.version,
        "sha": None,
        "docker_label": None,
        "num_workers": info.num_workers,
        "num_tokenizers": info.num_tokenizers,
        "grammar_support": True,  # TGI's --disable-grammar-support, the other way round
        "kv_cache": info.kv_cache,
        "block_size": info.block_size,
        "num_blocks": info.num_blocks,
        "speculate": info.speculate,
        "placement": info.placement,
        "quantize": info.quantize,
        "draft_model_id": info.draft_model_id,
        "lora_adapters": info.lora_adapters,
        "max_loras": info.max_loras,
        "max_lora_rank": info.max_lora_rank,
        "vision": info.vision,  # the model takes images: markdown `![](url)` in `inputs`, chat `image_url` parts
    }


def timing_headers(result: GenerateResult, inputs: str, total_s: float, compute_type: str) -> dict[str, str]:
    """TGI's timing headers for a whole generation (the gateway sees only the total)."""
    details = result.details
    num_generated = details.generated_tokens if details is not None else len(result.tokens)
    total_ms = int(total_s * 1000)
    headers = {
        "x-compute-type": compute_type,
        "x-compute-time": f"{total_s:.6f}",
        "x-compute-characters": str(len(inputs)),
        "x-total-time": str(total_ms),
        "x-time-per-token": str(total_ms // max(1, num_generated)),
        "x-generated-tokens": str(num_generated),
    }
    if details is not None:
        headers["x-prompt-tokens"] = str(details.input_tokens)
    return headers
