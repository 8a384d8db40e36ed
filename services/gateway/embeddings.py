"""`POST /v1/embeddings`: each input one prefill-only request through the scheduler, answered with
its pooled, normalised final hidden state in OpenAI's shape."""

from __future__ import annotations

import base64
from collections.abc import Awaitable
from typing import Any

import numpy as np
from aiohttp import web

from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.common.client.generate_result import GenerateResult
from ztgi.common.messages import InfoReply
from ztgi.services.gateway.embedding_request import (
    EmbeddingInput,
    EmbeddingRequest,
    check_servable,
    parse_embedding_request,
)
from ztgi.services.gateway.errors import HttpError
from ztgi.services.gateway.request_id import pipeline_request_id
from ztgi.services.gateway.schemas import read_json
from ztgi.services.gateway.state import CLIENT, CONFIG, SERVED_MODEL
from ztgi.services.gateway.streaming import gather_all


async def embeddings(request: web.Request) -> web.Response:
    """POST /v1/embeddings: one embedding per input, in the inputs' order."""
    config = request.app[CONFIG]
    embedding = parse_embedding_request(
        await read_json(request, config.max_payload_bytes, config.body_read_timeout_s), config.max_client_batch_size)
    info = await request.app[SERVED_MODEL].info()
    check_servable(embedding, info)
    client = request.app[CLIENT]
    results = await gather_all(_embed(client, item, embedding, pipeline_request_id(request))
                               for item in embedding.inputs)
    return web.json_response(embeddings_json(embedding, info, results))


def _embed(client: AsyncZtgiClient, item: EmbeddingInput, embedding: EmbeddingRequest,
           pipeline_id: str) -> Awaitable[GenerateResult]:
    if isinstance(item, str):
        return client.generate(item, parameters=embedding.parameters, request_id=pipeline_id)
    return client.generate(input_ids=item, parameters=embedding.parameters, request_id=pipeline_id)


def embeddings_json(embedding: EmbeddingRequest, info: InfoReply, results: list[GenerateResult]) -> dict[str, Any]:
    """OpenAI's CreateEmbeddingResponse."""
    data = [{"object": "embedding", "index": index, "embedding": _encoded(_vector(result, embedding.dimensions),
                                                                         embedding.encoding_format)}
            for index, result in enumerate(results)]
    prompt_tokens = sum(result.details.input_tokens for result in results if result.details is not None)
    return {"object": "list", "data": data, "model": info.model_id,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def _vector(result: GenerateResult, dimensions: int | None) -> np.ndarray:
    """The request's embedding; with `dimensions`, its first that many values, re-normalised."""
    if result.details is None or result.details.embedding is None:
        raise HttpError(500, "the worker answered an embedding request without its embedding", "generation")
    vector = np.frombuffer(result.details.embedding, dtype="<f4")
    if dimensions is None or dimensions >= vector.shape[0]:
        return vector
    head = vector[:dimensions]
    norm = float(np.linalg.norm(head))
    return head / norm if norm > 0 else head


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A list of floats, or base64 of the little-endian float32 bytes (what the openai SDK decodes)."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(value) for value in vector.astype(np.float32)]
