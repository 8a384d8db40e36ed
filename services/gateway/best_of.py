"""TGI's `best_of`: several sampled sequences of one prompt, the likeliest one returned.

The gateway sends the `best_of` requests at once, each with its own seed derived from one random
base (so each sequence's seed is reported and it can be replayed alone), and keeps the sequence
with the highest total token logprob; the others go to `details.best_of_sequences`.
"""

from __future__ import annotations

import dataclasses
import math
import secrets

from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.common.client.generate_result import GenerateResult
from ztgi.common.messages import GenerateParameters
from ztgi.services.gateway.streaming import gather_all

_SEED_BITS = 63  # derived seeds stay signed 64-bit integers, like the tokenizer's own


@dataclasses.dataclass(frozen=True)
class BestOf:
    """The chosen sequence and the others, in the order they were sent."""

    best: GenerateResult
    others: list[GenerateResult]


def derived_seeds(num_sequences: int, base_seed: int | None = None) -> list[int]:
    """`num_sequences` distinct seeds from `base_seed` (random when None)."""
    base = secrets.randbits(_SEED_BITS) if base_seed is None else base_seed
    return [(base + index) % 2**_SEED_BITS for index in range(num_sequences)]


def sequence_logprob(result: GenerateResult) -> float:
    """The total logprob of the generated tokens (tokens without one count as certain)."""
    return sum(t.logprob for t in result.tokens if t.logprob is not None and math.isfinite(t.logprob))


def choose(results: list[GenerateResult]) -> BestOf:
    best_index = max(range(len(results)), key=lambda index: sequence_logprob(results[index]))
    return BestOf(results[best_index], [r for i, r in enumerate(results) if i != best_index])


async def generate_best_of(client: AsyncZtgiClient, inputs: str, parameters: GenerateParameters,
                           best_of: int, images: list[bytes] | None = None) -> BestOf:
    """Runs `best_of` seeded copies of the request together; the first failure fails them all."""
    requests = [client.generate(inputs, parameters=dataclasses.replace(parameters, seed=seed), images=images)
                for seed in derived_seeds(best_of)]
    return choose(await gather_all(requests))
