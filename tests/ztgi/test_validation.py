"""Bad input raises ValueError naming the value, before any work starts."""

from __future__ import annotations

import re

import pytest

from ztgi import LLM, SamplingParams

BAD_PARAMS = [
    ({"temperature": -0.5}, "temperature", "-0.5"),
    ({"temperature": "hot"}, "temperature", "'hot'"),
    ({"top_p": 0.0}, "top_p", "0.0"),
    ({"top_p": 1.5}, "top_p", "1.5"),
    ({"top_k": -2}, "top_k", "-2"),
    ({"n": 0}, "n", "0"),
    ({"n": 1.5}, "n", "1.5"),
    ({"max_tokens": 0}, "max_tokens", "0"),
    ({"seed": -1}, "seed", "-1"),
    ({"logprobs": 21}, "logprobs", "21"),
    ({"prompt_logprobs": 5}, "prompt_logprobs", "5"),
    ({"repetition_penalty": 0.0}, "repetition_penalty", "0.0"),
    ({"presence_penalty": 2.5}, "presence_penalty", "2.5"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty", "nan"),
    ({"stop": [""]}, "stop", "['']"),
    ({"stop": 3}, "stop", "3"),
    ({"ignore_eos": "yes"}, "ignore_eos", "'yes'"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "0"),
    ({"logit_bias": {5: 101}}, "logit_bias", "101"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias", "-1"),
]


@pytest.mark.parametrize(("fields", "name", "value"), BAD_PARAMS, ids=[case[1] + "=" + case[2] for case in BAD_PARAMS])
def test_bad_sampling_params(fields: dict, name: str, value: str) -> None:
    """Each out-of-range or mistyped field raises ValueError naming the field and the value."""
    with pytest.raises(ValueError) as error:
        SamplingParams(**fields)
    assert name in str(error.value) and value in str(error.value)


def test_vllm_defaults_and_greedy() -> None:
    """vLLM's defaults (temperature 1 samples, 16 tokens); temperature 0 is greedy with no warper."""
    default = SamplingParams()
    assert (default.n, default.max_tokens, default.temperature, default.stop) == (1, 16, 1.0, [])
    assert default.to_parameters().do_sample
    greedy = SamplingParams(temperature=0, top_p=0.5, top_k=5).to_parameters()
    assert not greedy.do_sample and (greedy.temperature, greedy.top_p, greedy.top_k) == (None, None, None)
    assert SamplingParams(stop="\n").stop == ["\n"]
    assert [SamplingParams(seed=7, n=2).to_parameters(i).seed for i in range(2)] == [7, 8]


def no_work_done(llm: LLM, check) -> None:
    """Runs `check` and asserts the engine took no step and holds no request afterwards."""
    steps_before = llm.engine.slot.num_steps
    check()
    assert llm.engine.slot.num_steps == steps_before
    assert not llm.engine.has_unfinished() and not llm.engine.queue


def test_empty_prompt_list(llm: LLM) -> None:
    """No prompt at all, or an empty one: ValueError."""
    for prompts in ([], [""], ["ok", []]):
        with pytest.raises(ValueError, match="prompt"):
            no_work_done(llm, lambda prompts=prompts: llm.generate(prompts, use_tqdm=False))


def test_prompt_over_the_context(llm: LLM) -> None:
    """A prompt longer than max_input_tokens, or one whose max_tokens overflows the context, is
    refused with the counts, and the good prompts before it never run."""
    config = llm.engine.config
    too_long = [1] * (config.max_input_tokens + 5)
    with pytest.raises(ValueError, match=rf"prompt 1: .*{config.max_input_tokens + 5}"):
        no_work_done(llm, lambda: llm.generate(["fine", too_long], use_tqdm=False))
    overflow = SamplingParams(max_tokens=config.max_total_tokens)
    with pytest.raises(ValueError, match=rf"prompt 0: .*max_tokens.*{config.max_total_tokens}"):
        no_work_done(llm, lambda: llm.generate("fine", overflow, use_tqdm=False))


def test_bad_prompts_and_params_lists(llm: LLM) -> None:
    """Token ids outside the vocabulary, a prompt of the wrong type, or as many SamplingParams as
    prompts not matching: ValueError naming what is wrong."""
    vocab_size = llm.model.vocab_size
    cases = [
        (lambda: llm.generate([[5, vocab_size]], use_tqdm=False), rf"token id {vocab_size}"),
        (lambda: llm.generate([3.5], use_tqdm=False), re.escape("3.5")),
        (lambda: llm.generate(["a", "b"], [SamplingParams()] * 3, use_tqdm=False), "3 SamplingParams for 2 prompts"),
        (lambda: llm.chat([{"role": "user"}], use_tqdm=False), "content"),
        (lambda: llm.chat([], use_tqdm=False), "messages"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            no_work_done(llm, call)


def test_bad_engine_options(smollm2) -> None:
    """An unknown option fails before the model loads; a bad limit names the value."""
    with pytest.raises(TypeError, match="max_batch_sise"):
        LLM(smollm2.path, max_batch_sise=4)
    with pytest.raises(ValueError, match="float8"):
        LLM(smollm2.path, dtype="float8")
    with pytest.raises(ValueError, match="--quantize 'int2'"):
        LLM(smollm2.path, quantize="int2")
    with pytest.raises(ValueError, match="--quantized-max-rows"):
        LLM(smollm2.path, dtype="bfloat16", quantize="int4", quantized_max_rows=0)
    with pytest.raises(ValueError, match="^enable_prefix_caching must be True or False, got 'no'"):
        LLM(smollm2.path, enable_prefix_caching="no")
    with pytest.raises(ValueError, match="^pipeline_decode must be True or False, got 1"):
        LLM(smollm2.path, pipeline_decode=1)


def test_warmup_tokens_default_to_the_workers_environment(monkeypatch) -> None:
    """`cpu_warmup_prefill_tokens` not given: ZTGI_CPU_WARMUP_PREFILL_TOKENS as a server's workers
    read it (`none` too), else 512; given, it wins."""
    from ztgi.engine_options import EngineOptions

    monkeypatch.setenv("ZTGI_CPU_WARMUP_PREFILL_TOKENS", "96")
    assert EngineOptions.parse({}).cpu_warmup_prefill_tokens == 96
    assert EngineOptions.parse({"cpu_warmup_prefill_tokens": 128}).cpu_warmup_prefill_tokens == 128
    monkeypatch.setenv("ZTGI_CPU_WARMUP_PREFILL_TOKENS", "none")
    assert EngineOptions.parse({}).cpu_warmup_prefill_tokens is None
    monkeypatch.delenv("ZTGI_CPU_WARMUP_PREFILL_TOKENS")
    assert EngineOptions.parse({}).cpu_warmup_prefill_tokens == 512
