"""`RequestOutput.metrics`: when each request was queued, each of its tokens came, and it ended."""

from __future__ import annotations

import time

from ztgi import LLM, SamplingParams


def test_metrics_stamp_every_token_in_order(llm: LLM) -> None:
    """One stamp per token of the first sequence, none before the request was queued, the last one
    when it finished; requests given together are queued together."""
    started = time.monotonic()
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 6)]
    outputs = llm.generate(["The capital of France is", "1, 2, 3, 4,"], params, use_tqdm=False)
    finished = time.monotonic()
    for output, max_tokens in zip(outputs, (3, 6)):
        metrics = output.metrics
        assert metrics is not None and len(metrics.token_times) == len(output.outputs[0].token_ids) == max_tokens
        assert started <= metrics.arrival_time < metrics.first_token_time
        assert metrics.token_times == sorted(metrics.token_times)
        assert metrics.last_token_time == metrics.finished_time <= finished
    assert outputs[0].metrics.finished_time < outputs[1].metrics.finished_time  # the shorter ends first
    assert abs(outputs[0].metrics.arrival_time - outputs[1].metrics.arrival_time) < 0.1


def test_metrics_of_n_sequences_end_with_the_last(llm: LLM) -> None:
    """With n > 1 the token stamps are the first sequence's; the request ends with its last sequence."""
    [output] = llm.generate("Once upon a time", SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=4),
                            use_tqdm=False)
    assert output.metrics is not None and len(output.metrics.token_times) == len(output.outputs[0].token_ids)
    assert output.metrics.finished_time is not None
    assert output.metrics.finished_time >= output.metrics.token_times[-1]
