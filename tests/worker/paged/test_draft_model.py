"""A draft model (`--draft-model-id`) as the proposer: catch-up, proposals, parity, bad drafts."""

from __future__ import annotations

import copy
import dataclasses
import time

import pytest
import torch

from tests.worker.conftest import TEST_POOL_BLOCKS
from tests.worker.engine_helpers import batch_of, request, run_to_end, token_ids, with_blocks
from tests.worker.paged.test_speculation import run, same_generations
from ztgi.common.messages import SeqUpdate, Warmup, WarmupResult
from ztgi.common.model_source import ModelNotFoundError
from ztgi.services.worker.engine import Engine
from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.models.loading import load
from ztgi.services.worker.paged.batch import PagedBatch
from ztgi.services.worker.paged.model import PagedModel

PROMPT = [5, 6, 7, 8, 9, 10, 11] * 3


@pytest.fixture(scope="module")
def near_draft_dir(tiny_reference, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model's first layer alone, its weights perturbed: a draft with a layer count of its
    own whose proposals the tiny model accepts part of the time."""
    from transformers import LlamaForCausalLM

    config = copy.deepcopy(tiny_reference.config)
    config.num_hidden_layers = 1
    draft = LlamaForCausalLM(config)
    draft.load_state_dict({k: v for k, v in tiny_reference.state_dict().items() if "layers.1." not in k})
    torch.manual_seed(1)
    with torch.no_grad():
        for name, weight in draft.named_parameters():
            if "layers.0." in name and "norm" not in name:
                weight.add_(weight.std() * torch.randn_like(weight))
    directory = str(tmp_path_factory.mktemp("near-draft"))
    draft.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def near_draft(near_draft_dir: str) -> torch.nn.Module:
    """The near draft as a plain `transformers` module: the proposals must be its greedy tokens."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(near_draft_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def drafted(tiny_paged_model: PagedModel, near_draft_dir: str) -> PagedModel:
    """The tiny model with --speculate 4 and the near draft, pools of TEST_POOL_BLOCKS."""
    model = PagedModel(tiny_paged_model.loaded, tiny_paged_model.block_size, speculate=4,
                       draft=load(near_draft_dir, "float32", "cpu"))
    model.allocate_pool(TEST_POOL_BLOCKS)
    return model


def greedy(module: torch.nn.Module, tokens: list[int], count: int) -> list[int]:
    """`count` greedy tokens of `module` after `tokens`, one full forward each."""
    tokens = list(tokens)
    with torch.inference_mode():
        for _ in range(count):
            tokens.append(int(module(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[-count:]


@dataclasses.dataclass
class Checked:
    """What `checked_step` saw: drafts checked against the reference, and their acceptance."""

    num_drafts: int = 0
    num_proposed: int = 0
    num_accepted: int = 0


def checked_step(model: PagedModel, batch: PagedBatch, reference: torch.nn.Module, seen: Checked,
                 into: dict) -> PagedBatch | None:
    """One step whose proposals are first checked to be the draft's greedy continuation."""
    assert model.speculator is not None
    model.speculator.propose(batch)
    for sequence in batch.sequences:
        if sequence.draft:
            assert sequence.draft == greedy(reference, sequence.tokens, len(sequence.draft)), sequence.seq_id
            seen.num_drafts += 1
    generations, next_batch, timings = model.step(batch, time.perf_counter_ns())
    seen.num_proposed += timings.num_proposed
    seen.num_accepted += timings.num_accepted
    for generation in generations:
        into.setdefault(generation.seq_id, []).append(generation.token_id)
    return next_batch


def test_greedy_with_a_draft_equals_without(drafted, tiny_paged_model) -> None:
    """Greedy requests batched together get the same tokens, logprobs and top tokens with the draft
    proposing as without speculation, in fewer steps; part of the proposals are rejected."""
    requests = [request(1, PROMPT, 40, top_n_tokens=2), request(2, [7, 8, 9], 20),
                request(3, PROMPT[3:], 11, ignore_eos=True)]
    expected, plain_steps, _, _ = run(tiny_paged_model, requests)
    got, steps, num_proposed, num_accepted = run(drafted, requests)
    same_generations(got, expected)
    assert 0 < num_accepted < num_proposed and steps < plain_steps


def test_draft_runs_the_prefill_chunks_then_proposes_its_greedy_tokens(drafted, near_draft,
                                                                        tiny_paged_model) -> None:
    """Prompts prefilled 5 tokens a step: the draft runs each chunk with the target; every later
    proposal is the draft's own greedy continuation (its keys caught up through accepted and
    rejected runs), and the tokens are those without speculation."""
    requests = [request(1, PROMPT, 24, ignore_eos=True, chunk_len=5), request(2, PROMPT[:9], 24, ignore_eos=True,
                                                                             chunk_len=5)]
    batch: PagedBatch | None = batch_of(drafted, requests)
    seen, got = Checked(), {}
    while batch is not None:
        batch = checked_step(drafted, batch, near_draft, seen, got)
        if batch is None:
            break
        for sequence in batch.sequences:
            if sequence.is_prefilling:
                assert sequence.num_draft_computed == sequence.num_computed
        batch.apply([SeqUpdate(s.seq_id, [], 5) for s in batch.sequences if s.is_prefilling])
    whole = [dataclasses.replace(r, chunk_len=None) for r in requests]
    assert got == token_ids(run_to_end(tiny_paged_model, batch_of(tiny_paged_model, whole)))
    assert seen.num_drafts > 5 and 0 < seen.num_accepted < seen.num_proposed


def test_a_resumed_request_starts_the_draft_over(drafted, near_draft, tiny_paged_model) -> None:
    """Preemption: a request dropped after a few steps comes back with its tokens so far as its
    prompt, its first blocks found in the prefix cache (`cache_len`); the draft, which cannot
    know what those blocks hold of its own, runs from the first token, and proposes right."""
    whole = token_ids(run_to_end(tiny_paged_model, batch_of(tiny_paged_model, [request(1, PROMPT, 30,
                                                                                       ignore_eos=True)])))
    first = with_blocks(drafted, request(1, PROMPT, 30, ignore_eos=True))
    batch: PagedBatch | None = batch_of(drafted, [first])
    seen, got = Checked(), {}
    for _ in range(3):
        assert batch is not None
        batch = checked_step(drafted, batch, near_draft, seen, got)
    tokens = PROMPT + got[1]
    block_size = drafted.block_size
    resumed = dataclasses.replace(first, input_ids=tokens, max_new_tokens=30 - len(got[1]),
                                  cache_len=(len(PROMPT) // block_size) * block_size)
    batch = batch_of(drafted, [resumed])
    assert batch.sequences[0].num_draft_computed == 0 < batch.sequences[0].num_computed
    while batch is not None:
        batch = checked_step(drafted, batch, near_draft, seen, got)
    assert got == whole and seen.num_drafts > 3


def test_large_batches_skip_the_draft_and_filter_catches_it_up(drafted, near_draft, tiny_paged_model) -> None:
    """With more decoding sequences than the back-off allows the draft runs nothing; once a filter
    leaves a few, they catch up on the tokens it missed and propose its greedy tokens; a newcomer
    joined by concatenate is prefilled by the draft with the target."""
    from ztgi.services.worker.paged.speculator import MAX_SPECULATING_ROWS

    requests = [request(i + 1, PROMPT[i:], 16, ignore_eos=True) for i in range(MAX_SPECULATING_ROWS + 1)]
    batch: PagedBatch | None = batch_of(drafted, requests)
    seen, got = Checked(), {}
    for _ in range(3):
        assert batch is not None
        batch = checked_step(drafted, batch, near_draft, seen, got)
    assert batch is not None and seen.num_drafts == 0
    assert all(s.num_draft_computed == s.prompt_len < len(s.tokens) - 1 for s in batch.sequences)
    newcomer = request(20, PROMPT[2:12], 16, ignore_eos=True)
    batch = PagedBatch.concatenate([batch.filter([2, 5]), batch_of(drafted, [newcomer], batch_id=2)])
    while batch is not None:
        batch = checked_step(drafted, batch, near_draft, seen, got)
    alone = {r.seq_id: token_ids(run_to_end(tiny_paged_model, batch_of(tiny_paged_model, [r])))[r.seq_id]
             for r in (requests[1], requests[4], newcomer)}
    assert {rid: got[rid] for rid in alone} == alone and seen.num_drafts > 3


def test_rejection_sampling_with_the_draft_keeps_the_target_distribution(tiny_paged_model, tiny_model_dir) -> None:
    """900 seeded requests, the tiny model its own draft: after each one's first token the draft
    proposes its greedy next token x; the token chosen there follows the target's processed
    distribution p (x accepted with probability p(x)), within 4 standard deviations."""
    model = PagedModel(tiny_paged_model.loaded, tiny_paged_model.block_size, speculate=1,
                       draft=load(tiny_model_dir, "float32", "cpu"))
    model.allocate_pool(4096)
    prompt, sampling = [5, 6], dict(do_sample=True, temperature=1.0, top_k=3)
    batch = batch_of(model, [request(seed + 1, prompt, 3, ignore_eos=True, seed=seed, **sampling)
                             for seed in range(900)])
    model.generate_token(batch)  # the prefill: each request samples its first token; the draft runs the prompts
    assert model.draft_model is not None
    model.draft_model.propose(batch, [(sequence, 1) for sequence in batch.sequences], len(batch))
    generations, _, _ = model.step(batch, time.perf_counter_ns())
    by_request: dict = {}
    for generation in generations:
        by_request.setdefault(generation.seq_id, []).append(generation.token_id)
    for first in {s.tokens[len(prompt)] for s in batch.sequences}:
        logits = tiny_paged_model.loaded.module(torch.tensor([prompt + [first]])).logits[0, -1]
        probs = torch.softmax(batch.chooser.select([0]).process(logits[None], None, None), -1)[0]
        proposal = int(logits.argmax())
        rows = [by_request[s.seq_id] for s in batch.sequences if s.tokens[len(prompt)] == first]
        num = len(rows)
        assert num >= 100 and 0.05 < probs[proposal] < 0.95, (num, probs[proposal])
        for token in probs.nonzero().flatten().tolist():
            p = probs[token].item()
            seen = sum(row[0] == token for row in rows)
            assert abs(seen - p * num) <= 4 * (num * p * (1 - p)) ** 0.5 + 1, (first, token, seen, p, num)
        assert all(len(row) == (2 if row[0] == proposal else 1) for row in rows)


def test_warmup_counts_the_draft_pool_in_each_block(drafted) -> None:
    """On CPU the memory budget pays for both pools: as many blocks in each, the target's and the draft's."""
    assert drafted.draft_model is not None
    engine = Engine(drafted, memory_budget_mb=1, cpu_warmup_prefill_tokens=64)
    result = engine.warmup(Warmup(1, 100, 200, 400, None))
    assert isinstance(result, WarmupResult)
    per_block = drafted.kv_shape.bytes_per_block + drafted.draft_model.kv_shape.bytes_per_block
    assert result.num_blocks == 2**20 // per_block == drafted.num_blocks
    assert drafted.draft_model.pool is not None and drafted.draft_model.pool.num_blocks == result.num_blocks
    drafted.allocate_pool(TEST_POOL_BLOCKS)  # the other tests' pool


def test_a_bad_draft_is_refused(tiny_model_dir, tmp_path) -> None:
    """A draft of another vocabulary, a missing one, one without --speculate or on the padded KV
    cache: each a clear error naming the draft, before anything runs."""
    from tests.e2e.faults import build_small_vocab_model
    from ztgi.common.config import ConfigError
    from ztgi.services.worker.config import WorkerConfig

    small = build_small_vocab_model(str(tmp_path / "small"), tiny_model_dir)
    with pytest.raises(ValueError, match="vocabulary of 8192 tokens .* one of 49152: a draft must share"):
        load_model(tiny_model_dir, dtype="float32", device="cpu", speculate=4, draft_model_id=small)
    with pytest.raises(ModelNotFoundError, match="--draft-model-id '/no/such/draft'"):
        load_model(tiny_model_dir, dtype="float32", device="cpu", speculate=4, draft_model_id="/no/such/draft")
    with pytest.raises(ValueError, match="--draft-model-id needs --speculate N > 0"):
        load_model(tiny_model_dir, dtype="float32", device="cpu", draft_model_id=tiny_model_dir)
    with pytest.raises(ValueError, match="--draft-model-id needs the paged KV cache"):
        load_model(tiny_model_dir, dtype="float32", device="cpu", kv_cache="padded", speculate=4,
                   draft_model_id=tiny_model_dir)
    with pytest.raises(ConfigError, match="--draft-model-id needs --speculate"):
        WorkerConfig(draft_model_id=tiny_model_dir)


def test_a_draft_of_a_shorter_context_proposes_within_it(tiny_paged_model, tiny_model_dir) -> None:
    """A draft whose context ends at 24 positions (the target's at 2048): it runs and proposes only
    within them, and past them the request goes on one token a step, with the same tokens."""
    draft = load(tiny_model_dir, "float32", "cpu")
    draft.config.max_position_embeddings = 24
    model = PagedModel(tiny_paged_model.loaded, tiny_paged_model.block_size, speculate=4, draft=draft)
    model.allocate_pool(256)
    batch: PagedBatch | None = batch_of(model, [request(1, PROMPT, 12, ignore_eos=True)])
    got: dict = {}
    drafted_at = []
    while batch is not None:
        assert model.speculator is not None
        model.speculator.propose(batch)
        sequence = batch.sequences[0]
        if sequence.draft:
            drafted_at.append(len(sequence.tokens))
            assert len(sequence.tokens) + len(sequence.draft) - 1 <= 24
        assert sequence.num_draft_computed <= 24
        generations, batch, _ = model.step(batch, time.perf_counter_ns())
        got.setdefault(1, []).extend(g.token_id for g in generations)
    assert drafted_at and max(drafted_at) <= 24
    assert got == token_ids(run_to_end(tiny_paged_model, batch_of(tiny_paged_model, [request(1, PROMPT, 12,
                                                                                             ignore_eos=True)])))
