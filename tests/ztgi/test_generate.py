"""`LLM.generate` and `LLM.chat` on the embedded SmolLM2 against transformers' own `generate`."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch

from tests.ztgi.conftest import greedy_reference
from ztgi import LLM, SamplingParams

MIXED = pathlib.Path(__file__).parents[2] / "benchmarks" / "data" / "mixed.jsonl"
MAX_TOKENS = 16
NUM_BATCH_PROMPTS = 12
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)


RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "1, 2, 3, 4,",
]


@pytest.fixture(scope="module")
def prompts(llm: LLM) -> list[str]:
    """Raw text to continue, then the benchmark's mixed-set questions in the chat template (5 to
    60 tokens): as raw text a question mostly gets EOS at once."""
    lines = MIXED.read_text().splitlines()[:NUM_BATCH_PROMPTS - len(RAW_PROMPTS)]
    tokenizer = llm.get_tokenizer()
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": json.loads(line)["prompt"]}],
                                           tokenize=False, add_generation_prompt=True) for line in lines]
    return RAW_PROMPTS + chats


@pytest.fixture(scope="module")
def expected(llm: LLM, reference, prompts) -> list[list[int]]:
    """transformers' greedy ids for each prompt run alone."""
    tokenizer = llm.get_tokenizer()
    return [greedy_reference(reference, tokenizer.encode(prompt), MAX_TOKENS) for prompt in prompts]


def check_finish(llm: LLM, output, max_tokens: int) -> None:
    """`stop` on an end-of-sequence token (even the last one allowed), else `length` at max_tokens."""
    completion = output.outputs[0]
    if completion.token_ids[-1] in llm.model.eos_token_ids:
        assert (completion.finish_reason, completion.stop_reason) == ("stop", None)
    else:
        assert (completion.finish_reason, len(completion.token_ids)) == ("length", max_tokens)


def test_one_large_batch_equals_transformers_in_order(llm, prompts, expected) -> None:
    """All prompts in one call (batched together by the scheduler's loop): each result, in prompt
    order, has transformers' greedy ids and their text."""
    steps_before = llm.engine.slot.num_steps
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [output.prompt for output in outputs] == prompts
    assert [output.outputs[0].token_ids for output in outputs] == expected
    tokenizer = llm.get_tokenizer()
    for output, ids in zip(outputs, expected):
        assert output.outputs[0].text == tokenizer.decode(ids, skip_special_tokens=True)
        check_finish(llm, output, MAX_TOKENS)
    # one prefill of all of them, then decode steps: far fewer steps than prompts x tokens
    assert llm.engine.slot.num_steps - steps_before <= MAX_TOKENS + len(prompts)


def test_one_prompt_at_a_time_equals_transformers(llm, prompts, expected) -> None:
    """Each prompt in a call of its own, as text and as token ids: transformers' greedy ids."""
    tokenizer = llm.get_tokenizer()
    for prompt, ids in list(zip(prompts, expected))[:4]:
        [by_text] = llm.generate(prompt, GREEDY, use_tqdm=False)
        [by_ids] = llm.generate({"prompt_token_ids": tokenizer.encode(prompt)}, GREEDY, use_tqdm=False)
        assert by_text.outputs[0].token_ids == ids
        assert by_ids.outputs[0].token_ids == ids and by_ids.prompt is None
        assert by_ids.outputs[0].text == by_text.outputs[0].text


def test_chat_applies_the_template(llm, reference) -> None:
    """A conversation is rendered by the model's chat template; the reply is transformers' greedy
    reply to the same ids; a list of conversations gives one result each."""
    tokenizer = llm.get_tokenizer()
    conversations = [[{"role": "user", "content": "What is 2+2?"}],
                     [{"role": "system", "content": "Answer in French."},
                      {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}]]
    outputs = llm.chat(conversations, GREEDY, use_tqdm=False)
    assert len(outputs) == 2
    for output, conversation in zip(outputs, conversations):
        flat = [{"role": m["role"],
                 "content": m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]}
                for m in conversation]
        text = tokenizer.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)
        assert output.prompt == text
        assert output.prompt_token_ids == tokenizer.encode(text, add_special_tokens=False)
        assert output.outputs[0].token_ids == greedy_reference(reference, output.prompt_token_ids, MAX_TOKENS)
    [single] = llm.chat(conversations[0], GREEDY, use_tqdm=False)
    assert single.outputs[0].text == outputs[0].outputs[0].text


def test_stop_string_left_out_or_kept(llm, prompts) -> None:
    """A stop string ends the sequence where it appears: left out of the text (vLLM's default) or
    kept with include_stop_str_in_output; finish_reason stop, stop_reason the string."""
    [free] = llm.generate(prompts[2], GREEDY, use_tqdm=False)
    text = free.outputs[0].text
    stop = text.split()[3]  # a word the greedy text reaches mid-way
    cut = text[:text.index(stop)]
    [stopped] = llm.generate(prompts[2], SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=[stop, "§"]),
                             use_tqdm=False)
    [kept] = llm.generate(prompts[2], SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=stop,
                                                     include_stop_str_in_output=True), use_tqdm=False)
    for output in (stopped, kept):
        completion = output.outputs[0]
        assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
        assert len(completion.token_ids) < MAX_TOKENS
        assert completion.token_ids == free.outputs[0].token_ids[:len(completion.token_ids)]
    assert stopped.outputs[0].text == cut
    assert kept.outputs[0].text == cut + stop
    assert not llm.engine.has_unfinished() and not llm.engine.slot.batches


def test_n_sequences_sampled_and_replayable(llm, prompts) -> None:
    """n=3 with a seed: three sequences, not all alike; sequence i is what n=1 with seed + i gives,
    and the same call again gives the same three."""
    params = SamplingParams(n=3, temperature=1.0, top_p=0.95, seed=1234, max_tokens=12)
    [first] = llm.generate(prompts[1], params, use_tqdm=False)
    [again] = llm.generate(prompts[1], params, use_tqdm=False)
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in first.outputs}) > 1
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in first.outputs]
    [alone] = llm.generate(prompts[1], SamplingParams(temperature=1.0, top_p=0.95, seed=1235, max_tokens=12),
                           use_tqdm=False)
    assert alone.outputs[0].token_ids == first.outputs[1].token_ids


def test_greedy_n_and_one_params_per_prompt(llm, prompts, expected) -> None:
    """Greedy n=2 gives the greedy sequence twice; one SamplingParams per prompt applies to its own prompt."""
    short = SamplingParams(temperature=0, max_tokens=4)
    outputs = llm.generate(prompts[:2], [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, n=2), short],
                           use_tqdm=False)
    assert [c.token_ids for c in outputs[0].outputs] == [expected[0], expected[0]]
    assert outputs[1].outputs[0].token_ids == expected[1][:4]
    assert outputs[1].outputs[0].finish_reason == "length"


def test_logprobs_on_request(llm, reference, prompts) -> None:
    """logprobs=3: per token the chosen one (rank 1 when greedy) and the 3 best, with transformers'
    log-softmax of the step's logits; prompt_logprobs=0: each prompt token's own logprob."""
    [output] = llm.generate(prompts[0], SamplingParams(temperature=0, max_tokens=4, logprobs=3, prompt_logprobs=0),
                            use_tqdm=False)
    completion = output.outputs[0]
    ids = output.prompt_token_ids + completion.token_ids
    with torch.no_grad():
        logprobs = torch.log_softmax(reference(torch.tensor([ids])).logits[0].float(), dim=-1)
    for position, (token_id, step) in enumerate(zip(completion.token_ids, completion.logprobs)):
        row = logprobs[len(output.prompt_token_ids) - 1 + position]
        assert step[token_id].rank == 1
        assert sorted(step) == sorted(torch.topk(row, 3).indices.tolist())
        for top_id, logprob in step.items():
            assert logprob.logprob == pytest.approx(row[top_id].item(), abs=1e-3)
    assert completion.cumulative_logprob == pytest.approx(sum(s[t].logprob for s, t in zip(completion.logprobs,
                                                                                           completion.token_ids)))
    assert output.prompt_logprobs[0] is None
    for position, entry in enumerate(output.prompt_logprobs[1:], start=1):
        [(token_id, logprob)] = entry.items()
        assert token_id == ids[position]
        assert logprob.logprob == pytest.approx(logprobs[position - 1, token_id].item(), abs=1e-3)
    assert all(math.isfinite(s[t].logprob) for s, t in zip(completion.logprobs, completion.token_ids))


def test_logit_bias_forces_and_removes_tokens(llm) -> None:
    """vLLM's `logit_bias` offline: +100 on one token makes it every token; -100 on the greedy
    first token makes the first token another."""
    [equals] = llm.get_tokenizer().encode("=", add_special_tokens=False)
    prompt = "The capital of France is"
    [plain] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    first = plain.outputs[0].token_ids[0]
    [removed] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3, logit_bias={first: -100}),
                             use_tqdm=False)
    assert removed.outputs[0].token_ids[0] != first
    [forced] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3, logit_bias={equals: 100}),
                            use_tqdm=False)
    assert forced.outputs[0].token_ids == [equals] * 3


def test_progress_bar(llm, prompts, capsys) -> None:
    """The bar counts prompts and shows tokens/s on stderr; use_tqdm=False prints nothing."""
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2), use_tqdm=True)
    bar = capsys.readouterr().err
    assert "Processed prompts" in bar and "2/2" in bar and "output:" in bar and "toks/s" in bar
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert capsys.readouterr().err == ""


def test_speculate_gives_the_same_replies(llm, smollm2) -> None:
    """`LLM(speculate=4)`: copy-heavy chat replies equal those of speculation off, token for token."""
    speculating = LLM(smollm2.path, dtype="float32", device="cpu", speculate=4)
    conversations = [[{"role": "user", "content": "Repeat exactly: def add(a, b):\n    return a + b\n"}],
                     [{"role": "user", "content": "What is 2+2?"}]]
    expected = [o.outputs[0].token_ids for o in llm.chat(conversations, GREEDY, use_tqdm=False)]
    assert [o.outputs[0].token_ids for o in speculating.chat(conversations, GREEDY, use_tqdm=False)] == expected


def test_quantized_weights_in_process(tiny_model_dir) -> None:
    """`LLM(quantize="int4")`: the forward's blocks hold 4-bit weights (a float copy for steps of
    more than `quantized_max_rows` rows) and greedy replies come back whole; `quantized_max_rows=None`
    keeps the 4-bit weights alone and, with every step of this batch within 8 rows either way, gives
    the same tokens."""
    from ztgi.services.worker.layers.quantization.block_linear import Int4BlockLinear
    from ztgi.services.worker.layers.quantization.quantized_linear import Int4Linear, RowDispatch

    quantized = LLM(tiny_model_dir, dtype="bfloat16", device="cpu", quantize="int4")
    alone = LLM(tiny_model_dir, dtype="bfloat16", device="cpu", quantize="int4", quantized_max_rows=None)
    assert isinstance(quantized.model.forward_pass.weights.layers[0].qkv, RowDispatch)
    assert isinstance(alone.model.forward_pass.weights.layers[0].qkv, (Int4Linear, Int4BlockLinear))
    prompts = [[1, 504, 3458], [9690, 17]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    replies = [o.outputs[0].token_ids for o in quantized.generate(prompts, params, use_tqdm=False)]
    assert [len(r) for r in replies] == [6, 6]
    assert [o.outputs[0].token_ids for o in alone.generate(prompts, params, use_tqdm=False)] == replies


def test_quantized_prompt_longer_than_a_step(smollm2) -> None:
    """`quantize="int4"|"int8"` on the embedded GGUF: a prompt chunked over several steps (a step of
    prefill alone needs no logits: an empty product for the Q8_0 lm_head) comes back whole. The
    CPU's own dtype (bfloat16 where it has the units; emulated bfloat16 would only be slow)."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompt = {"prompt_token_ids": [(7 * i) % 1000 + 10 for i in range(1500)]}
    for quantize in ("int4", "int8"):
        engine = LLM(smollm2.path, dtype="auto", device="cpu", quantize=quantize, enable_prefix_caching=False)
        [output] = engine.generate(prompt, params, use_tqdm=False)
        assert len(output.outputs[0].token_ids) == 4, quantize


def test_prefix_caching_can_be_turned_off(tiny_model_dir) -> None:
    """`LLM(enable_prefix_caching=False)` (vLLM's name; `prefix_caching` is the server's): the
    engine's block allocator keeps no cache, so a prompt that starts like an earlier one is computed
    whole, with the same replies as the default engine, which reuses the earlier prompt's blocks."""
    cached = LLM(tiny_model_dir, dtype="float32", device="cpu", kv_cache="paged")
    uncached = LLM(tiny_model_dir, dtype="float32", device="cpu", kv_cache="paged", enable_prefix_caching=False)
    assert cached.engine.slot.allocator.cache is not None
    assert uncached.engine.slot.allocator.cache is None
    prompts = [list(range(5, 45)), list(range(5, 45)) + [7, 9]]  # the second starts with the first's 2 blocks
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    replies = [[o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
               for llm in (cached, uncached)]
    assert replies[0] == replies[1]
    assert cached.engine.slot.allocator.num_cached > 0 and uncached.engine.slot.allocator.num_cached == 0


def test_a_draft_model_gives_the_same_replies(llm, smollm2, tiny_draft_dir) -> None:
    """`LLM(speculate=4, draft_model=...)` (here SmolLM2 its own draft, so most proposals are
    accepted): the same replies; a draft without `speculate` is refused before anything loads."""
    drafted = LLM(smollm2.path, dtype="float32", device="cpu", speculate=4, draft_model=smollm2.path)
    conversations = [[{"role": "user", "content": "Repeat exactly: def add(a, b):\n    return a + b\n"}],
                     [{"role": "user", "content": "What is 2+2?"}]]
    expected = [o.outputs[0].token_ids for o in llm.chat(conversations, GREEDY, use_tqdm=False)]
    assert [o.outputs[0].token_ids for o in drafted.chat(conversations, GREEDY, use_tqdm=False)] == expected
    with pytest.raises(ValueError, match="--draft-model-id needs --speculate"):
        LLM(smollm2.path, dtype="float32", device="cpu", speculative_model=tiny_draft_dir)
