"""A model split over a real gloo group (ranks in processes of their own) generates what the whole
model generates: greedy token ids equal, logprobs and top tokens equal within float32 rounding, for
every natively served family, int4 weights, a GGUF's blocks as stored and LoRA adapters, with
chunked prefill and with speculation, KV heads split (2 ranks) and replicated (4 ranks over 2 KV
heads)."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from tests.lora_adapters import RECIPES, fused_recipe, save_adapter
from tests.worker.engine_helpers import batch_of, request, run_chunked, run_to_end
from tests.worker.models.family_models import save_family_model
from tests.worker.models.mixed_gguf import write_mixed_gguf
from tests.worker.shards.rank_runs import run_in_group
from ztgi.common.messages import AdapterRef, Warmup
from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.shards.shard_group import ShardGroup

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text")
PROMPTS = [[1, 9, 4000, 312, 77, 18000, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 21, 22],
           [1, 350, 2, 9000], [1, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42]]
FLOAT32 = dict(dtype="float32", device="cpu", kv_cache="paged")


Generated = list[tuple[int, list[int], list[float], list[list[int]]]]


def generations(model, chunk: int | None = None, adapters: dict[str, str] | None = None) -> Generated:
    """Each request's (id, tokens, logprobs, top-3 ids), greedy, 10 new tokens, whole or chunked;
    with `adapters`, each prompt under the base and each adapter."""
    model.warmup(Warmup(1, 64, 128, 128, None), 64, 128, 500)
    refs = [None, *(AdapterRef(name, path, 1) for name, path in (adapters or {}).items())]
    requests = [dataclasses.replace(request(len(refs) * i + j, ids, 10, ignore_eos=True, top_n_tokens=3), adapter=ref)
                for i, ids in enumerate(PROMPTS) for j, ref in enumerate(refs)]
    out = (run_chunked(model, requests, chunk) if chunk else
           run_to_end(model, batch_of(model, requests)))
    return [(seq_id, [g.token_id for g in gens], [g.logprob for g in gens], [list(g.top_ids) for g in gens])
            for seq_id, gens in sorted(out.items())]


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory) -> str:
    return write_mixed_gguf(str(tmp_path_factory.mktemp("mixed-gguf") / "mixed.gguf"))


@pytest.fixture(scope="module")
def family_dirs(smollm2, tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    dirs = {family: save_family_model(family, str(tmp_path_factory.mktemp(family)), smollm2.path)
            for family in FAMILIES if family != "llama"}
    return {"llama": tiny_model_dir, **dirs}


def assert_same(sharded: list, whole: list, family: str) -> None:
    for (seq_id, tokens, logprobs, top), (_, tokens_1, logprobs_1, top_1) in zip(sharded, whole, strict=True):
        assert tokens == tokens_1, (family, seq_id)
        assert logprobs == pytest.approx(logprobs_1, abs=2e-4), (family, seq_id)
        assert top == top_1, (family, seq_id)


def every_family(model_dirs: dict[str, str], gguf_file: str, group: ShardGroup | None = None) -> dict[str, list]:
    """Each family's generations; Llama's with int4 weights (each rank quantizes its slices: groups
    of 32 inputs, which the split keeps whole); a GGUF of every block type as stored (each rank
    slices the file's blocks; an output projection whose rank's columns split a K-quant's 256-weight
    super-blocks is dequantized)."""
    out = {family: generations(load_model(path, group=group, **FLOAT32)) for family, path in model_dirs.items()}
    out["llama int4"] = generations(load_model(model_dirs["llama"], group=group, quantize="int4", **FLOAT32))
    out["gguf as stored"] = generations(load_model(gguf_file, group=group, quantize="gguf", **FLOAT32))
    return out


def chunked_and_speculated(model_dir: str, group: ShardGroup | None = None) -> list:
    """Prompts prefilled 6 tokens a step, prompt-lookup speculation of 4 tokens."""
    return generations(load_model(model_dir, group=group, speculate=4, **FLOAT32), chunk=6)


def with_adapters(model_dirs: dict[str, str], adapters: dict[str, dict[str, str]],
                  group: ShardGroup | None = None) -> dict[str, list]:
    """Every prompt under the base and three adapters, in one batch."""
    return {family: generations(load_model(model_dirs[family], group=group, **FLOAT32), adapters=adapters[family])
            for family in adapters}


def test_two_shards_with_lora_adapters_generate_what_the_whole_model_does(family_dirs: dict[str, str],
                                                                          tmp_path_factory) -> None:
    """Each rank cuts an adapter as its weights are cut (B's rows for q/k/v and gate/up, A's
    columns for the output and down, added before the all-reduce): Qwen2's split projections and
    Phi-3's fused ones, ranks 4 to 16 over attention and MLP, rsLoRA."""
    root = tmp_path_factory.mktemp("shard-adapters")
    adapters = {family: {name: save_adapter(family_dirs[family], str(root / family / name),
                                            fused_recipe(recipe) if family == "phi3" else recipe)
                         for name, recipe in RECIPES.items()} for family in ("qwen2", "phi3")}
    whole = with_adapters(family_dirs, adapters)
    for family in adapters:
        assert len({tuple(tokens) for _, tokens, _, _ in whole[family]}) > len(PROMPTS), "the adapters change answers"
    for rank in run_in_group(2, functools.partial(with_adapters, family_dirs, adapters)):
        for family in adapters:
            assert_same(rank[family], whole[family], family)


def test_two_shards_generate_what_the_whole_model_does(family_dirs: dict[str, str], mixed_gguf: str) -> None:
    whole = every_family(family_dirs, mixed_gguf)
    ranks = run_in_group(2, functools.partial(every_family, family_dirs, mixed_gguf))
    assert ranks[0] == ranks[1], "every rank keeps the same batch state"
    for family in (*FAMILIES, "llama int4", "gguf as stored"):
        assert_same(ranks[0][family], whole[family], family)


def test_four_shards_replicate_kv_heads_chunked_and_speculating(family_dirs: dict[str, str]) -> None:
    """Four ranks over Qwen2's 2 KV heads (each held by two ranks), chunked and speculating."""
    whole = chunked_and_speculated(family_dirs["qwen2"])
    for rank in run_in_group(4, functools.partial(chunked_and_speculated, family_dirs["qwen2"])):
        assert_same(rank, whole, "qwen2")
