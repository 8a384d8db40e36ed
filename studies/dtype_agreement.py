"""How far a dtype's (or quantized weights') greedy generations drift from float32's, on the same prompts.

    python -m studies.dtype_agreement --dtype bfloat16 --output-tokens 32
    python -m studies.dtype_agreement --dtype bfloat16 --quantize int8 --reference-dtype bfloat16

Every prompt of the dataset is generated greedily (EOS ignored) in one batch, once with float
weights in `--reference-dtype` (float32 unless set) and once in `--dtype` with `--quantize`.
Reported: the share of requests whose tokens are all identical, the share of
token positions identical before each request's first divergence (over all positions), and the
largest absolute difference of the chosen tokens' logprobs while both runs still agree.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Sequence

from ztgi.bench.baseline_config import BaselineConfig
from ztgi.bench.baseline_model import load_tokenizer
from ztgi.bench.baseline_setup import parse_workload
from ztgi.bench.offline_workload import encode_prompts
from ztgi.common.messages import Generation, SamplingParameters, WorkerRequest
from ztgi.services.worker.model_loader import load_padded_model
from ztgi.services.worker.padded.batch import CausalLMBatch
from ztgi.services.worker.padded.model import PaddedModel

logger = logging.getLogger(__name__)
REFERENCE_DTYPE = "float32"


@dataclasses.dataclass(frozen=True)
class DtypeAgreementConfig(BaselineConfig):
    """`--dtype` against float32: greedy token agreement and logprob differences."""

    dtype: str = "bfloat16"
    output_tokens: int | None = 32
    reference_dtype: str = dataclasses.field(default=REFERENCE_DTYPE, metadata={
        "help": "the dtype of the reference run (always float weights)"})
    quantized_max_rows: int | None = dataclasses.field(default=None, metadata={
        "help": "with --quantize: the server's float copy above this many rows; none (the default here): "
                "the quantized weights in every step, their drift at its largest (this benchmark runs "
                "every prompt in one batch, so a row limit would leave it float weights throughout)"})


def generate(model: PaddedModel, input_ids: Sequence[list[int]],
             max_new_tokens: Sequence[int]) -> list[list[Generation]]:
    """Each prompt's greedy generations, all prompts in one batch."""
    requests = [WorkerRequest(i, list(ids), SamplingParameters(), n, True)
                for i, (ids, n) in enumerate(zip(input_ids, max_new_tokens))]
    batch: CausalLMBatch | None = CausalLMBatch.from_requests(requests, 1, 2**62, model)
    result: list[list[Generation]] = [[] for _ in requests]
    while batch is not None:
        generations, batch, _ = model.generate_token(batch)
        for generation in generations:
            result[generation.seq_id].append(generation)
    return result


def agreement(reference: list[list[Generation]], other: list[list[Generation]]) -> dict[str, float]:
    num_identical = num_agreeing = num_positions = 0
    max_logprob_diff = 0.0
    for ref, oth in zip(reference, other):
        prefix = 0
        while prefix < len(ref) and ref[prefix].token_id == oth[prefix].token_id:
            max_logprob_diff = max(max_logprob_diff, abs(ref[prefix].logprob - oth[prefix].logprob))
            prefix += 1
        num_identical += prefix == len(ref)
        num_agreeing += prefix
        num_positions += len(ref)
    return {"requests_identical": num_identical / len(reference),
            "positions_before_divergence": num_agreeing / num_positions,
            "max_abs_logprob_diff": max_logprob_diff, "num_requests": len(reference),
            "num_positions": num_positions}


def main(argv: Sequence[str] | None = None) -> int:
    setup = parse_workload(DtypeAgreementConfig, argv, "dtype_agreement")
    if setup is None:
        return 2
    config, prompts = setup
    requests = encode_prompts(load_tokenizer(config.model_id), prompts)
    input_ids, max_new_tokens = [r.input_ids for r in requests], [r.max_new_tokens for r in requests]
    reference = generate(load_padded_model(config.model_id, config.reference_dtype, config.device),
                         input_ids, max_new_tokens)
    other = generate(load_padded_model(config.model_id, config.dtype, config.device, quantize=config.quantize,
                                       quantized_max_rows=config.quantized_max_rows),
                     input_ids, max_new_tokens)
    result = {"dtype": config.dtype, "quantize": config.quantize, "reference": config.reference_dtype,
              **agreement(reference, other)}
    sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
