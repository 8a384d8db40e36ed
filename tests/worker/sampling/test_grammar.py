"""The grammar mask in the chooser: random weights still write valid JSON and regex matches, the
per-row state follows filter and concatenate, and unconstrained rows pay nothing."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from transformers import AutoTokenizer

from tests.worker.engine_helpers import batch_of, request, run_to_end, step, token_ids
from ztgi.common.grammar import json_grammar
from ztgi.common.messages import Grammar
from ztgi.services.worker.backend import Model
from ztgi.services.worker.engine import Engine
from ztgi.services.worker.sampling import grammar as grammars

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "size": {"type": "integer", "minimum": 0, "maximum": 999},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    "ok": {"type": ["boolean", "null"]}},
    "required": ["name", "size", "tags", "ok"], "additionalProperties": False}
REGEX = r"[A-Z]{2}-[0-9]{3}"
PROMPT = [1, 504, 3458, 314, 253]
MAX_NEW_TOKENS = 64


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: str):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module", autouse=True)
def compiler(tiny_model_dir: str) -> grammars.GrammarCompiler:
    """The worker's grammar vocabulary: the tiny model's (SmolLM2's) tokenizer."""
    return grammars.configure(tiny_model_dir, [2])


def text_of(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def constrained(seq_id: int, grammar: Grammar, **sampling: object):
    return request(seq_id, PROMPT, MAX_NEW_TOKENS, grammar=grammar, **sampling)


def test_random_weights_write_valid_json_and_regex_beside_a_free_row(tiny_each_layout: Model, tokenizer) -> None:
    """Greedy and sampled rows under a schema, a regex row and an unconstrained row in one batch
    (each KV layout): every constrained answer is valid and ends with EOS, the free row is
    untouched by the masks."""
    tiny_model = tiny_each_layout
    schema = json_grammar(SCHEMA)
    requests = [constrained(1, schema), constrained(2, schema, do_sample=True, seed=7, temperature=1.5),
                constrained(3, Grammar("regex", REGEX)), request(4, PROMPT, 8)]
    generations = run_to_end(tiny_model, batch_of(tiny_model, requests))
    ids = token_ids(generations)
    for seq_id in (1, 2):
        jsonschema.validate(json.loads(text_of(tokenizer, ids[seq_id])), SCHEMA)
        assert generations[seq_id][-1].finish_reason == "eos_token"
    assert re.fullmatch(REGEX, text_of(tokenizer, ids[3]))
    free = token_ids(run_to_end(tiny_model, batch_of(tiny_model, [request(4, PROMPT, 8)])))
    assert ids[4] == free[4]


def test_grammar_state_follows_filter_and_concatenate(tiny_each_layout: Model, tokenizer) -> None:
    """A constrained row keeps its place in its grammar when the batch is filtered and joined
    with another one mid-answer (each KV layout)."""
    tiny_model = tiny_each_layout
    regex_a, regex_b = Grammar("regex", "(ab){6}"), Grammar("regex", "(xyz){4}")
    first = batch_of(tiny_model, [constrained(1, regex_a), constrained(2, regex_b), request(3, PROMPT, 30)])
    generations: dict = {}
    for _ in range(3):
        first = step(tiny_model, first, generations)
    first = first.filter([3, 1])
    second = batch_of(tiny_model, [constrained(4, regex_b), request(5, PROMPT, 4)], batch_id=2)
    second = step(tiny_model, second, generations)
    joined = type(first).concatenate([first, second])
    rows = sorted(joined.seq_ids.index(rid) for rid in (1, 4))
    assert joined.chooser.grammar_rows == rows
    run_to_end(tiny_model, joined, generations)
    ids = token_ids(generations)
    assert text_of(tokenizer, ids[1]) == "ab" * 6 and text_of(tokenizer, ids[4]) == "xyz" * 4


def test_grammars_compile_once_and_free_batches_do_no_grammar_work(tiny_model: Model,
                                                                  compiler: grammars.GrammarCompiler) -> None:
    """Two requests with one schema compile it once; a batch without grammar has no grammar state."""
    schema = json_grammar({"type": "object", "properties": {"n": {"type": "integer", "maximum": 5}},
                           "required": ["n"], "additionalProperties": False})
    before = compiler.num_compiled
    batch = batch_of(tiny_model, [constrained(1, schema), constrained(2, schema)])
    assert compiler.num_compiled == before + 1
    run_to_end(tiny_model, batch)
    free = batch_of(tiny_model, [request(1, PROMPT, 4), request(2, PROMPT, 4)])
    assert free.chooser.grammar_rows == [] and free.chooser.grammar_states == [None, None]


def test_a_grammar_that_cannot_compile_fails_its_prefill_not_the_worker(tiny_model: Model) -> None:
    """A Prefill with an invalid grammar answers CommandFailed naming the request; the engine goes on."""
    from ztgi.common.messages import Batch, CommandFailed, Prefill, StepResult

    engine = Engine(tiny_model, memory_budget_mb=64)
    bad = constrained(1, Grammar("regex", "[a-z"))
    answer = engine.prefill(Prefill(1, Batch(1, [bad], 100)))
    assert isinstance(answer, CommandFailed) and answer.seq_ids == [1]
    assert "request 1" in answer.error and "regex" in answer.error
    good = engine.prefill(Prefill(2, Batch(2, [request(2, PROMPT, 2)], 100)))
    assert isinstance(good, StepResult)


def test_a_grammar_whose_mask_exceeds_its_budget_ends_its_request_with_an_error(tiny_each_layout: Model) -> None:
    """A grammar that compiles but whose lexer runs out of its budget at a later token (one that
    escapes the written-out size check: Python's parser does not read `(?<name>...)`) ends its
    request with finish_reason "error" and the reason; the row beside it runs to its end. Before,
    the row ended with EOS: a 200 whose text broke its grammar."""
    failing = Grammar("lark", 'start: "ok" /((?<a>x{1000})){1000}/')
    generations = run_to_end(tiny_each_layout, batch_of(tiny_each_layout, [constrained(1, failing),
                                                                           request(2, PROMPT, 8)]))
    last = generations[1][-1]
    assert last.finish_reason == "error" and last.error is not None, last
    assert "the grammar failed" in last.error and "too many expressions" in last.error
    assert all(g.finish_reason is None for g in generations[1][:-1])
    assert [g.finish_reason for g in generations[2]] == [None] * 7 + ["length"]
