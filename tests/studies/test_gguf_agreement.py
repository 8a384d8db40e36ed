"""`studies.gguf_agreement`: the float anchor of a GGUF, llama.cpp's type files made from it, the
agreement measure, and a whole run on a tiny random Llama beside llama-server."""

from __future__ import annotations

import json
import os

import gguf
import numpy as np
import pytest

from studies import gguf_agreement
from studies.gguf_agreement import Agreement, RunCache, first_divergence, markdown_table
from studies.gguf_anchor import AnchorFiles, tensor_types, write_float16_anchor
from studies.greedy_runs import GreedyRequests, GreedyRun
from ztgi.common.model_source import embedded_gguf_path

LLAMA_CPP_BUILD = os.environ.get("ZTGI_LLAMA_CPP_BUILD", "/work/llama.cpp-build")
LLAMA_CPP_TOOLS = ("llama-server", "llama-quantize")
needs_llama_cpp = pytest.mark.skipif(
    not all(os.access(os.path.join(LLAMA_CPP_BUILD, "bin", name), os.X_OK) for name in LLAMA_CPP_TOOLS),
    reason=f"no llama.cpp build (llama-server, llama-quantize) at {LLAMA_CPP_BUILD}")

HIDDEN, INTERMEDIATE, NUM_HEADS, NUM_KV_HEADS, NUM_LAYERS = 256, 512, 4, 2, 2  # rows fit every block type
Q = gguf.GGMLQuantizationType


def _tiny_llama_tensors(seed: int, vocab_size: int) -> list[tuple[str, np.ndarray]]:
    """A 2-layer Llama of random weights in llama.cpp's tensor names and order."""
    rng = np.random.default_rng(seed)
    kv = NUM_KV_HEADS * HIDDEN // NUM_HEADS
    shapes = [("token_embd.weight", (vocab_size, HIDDEN))]
    for layer in range(NUM_LAYERS):
        shapes += [(f"blk.{layer}.{name}.weight", shape) for name, shape in (
            ("attn_norm", (HIDDEN,)), ("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (kv, HIDDEN)), ("attn_v", (kv, HIDDEN)),
            ("attn_output", (HIDDEN, HIDDEN)), ("ffn_norm", (HIDDEN,)), ("ffn_gate", (INTERMEDIATE, HIDDEN)),
            ("ffn_up", (INTERMEDIATE, HIDDEN)), ("ffn_down", (HIDDEN, INTERMEDIATE)))]
    shapes.append(("output_norm.weight", (HIDDEN,)))
    return [(name, np.ones(shape, np.float32) if len(shape) == 1 else rng.standard_normal(shape, np.float32) * 0.05)
            for name, shape in shapes]


def write_tiny_q8_0_llama(path: str, seed: int = 0, with_tokenizer: bool = True) -> None:
    """A tiny Llama GGUF with Q8_0 matrices and F32 norms: the embedded GGUF's tokenizer and
    vocabulary, or (`with_tokenizer` false) no tokenizer and 512 rows of embedding, a file no server loads."""
    writer = gguf.GGUFWriter(path, "llama")
    for key, value in (("block_count", NUM_LAYERS), ("context_length", 1024), ("embedding_length", HIDDEN),
                       ("feed_forward_length", INTERMEDIATE), ("attention.head_count", NUM_HEADS),
                       ("attention.head_count_kv", NUM_KV_HEADS), ("rope.dimension_count", HIDDEN // NUM_HEADS)):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    for key, field in gguf.GGUFReader(embedded_gguf_path()).fields.items() if with_tokenizer else ():
        if key.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    for name, values in _tiny_llama_tensors(seed, 49152 if with_tokenizer else 512):
        if values.ndim == 1:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, Q.Q8_0), raw_dtype=Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("tiny") / "tiny-llama.Q8_0.gguf")
    write_tiny_q8_0_llama(path)
    return path


def test_the_anchor_holds_the_dequantized_weights_and_the_metadata(tmp_path):
    """Every tensor of the anchor is its source's dequantized values (F16 matrices, F32 norms), in the
    same order, with every metadata field copied and the file type said to be F16."""
    write_tiny_q8_0_llama(str(tmp_path / "source.gguf"), with_tokenizer=False)
    write_float16_anchor(str(tmp_path / "source.gguf"), str(tmp_path / "anchor.gguf"))
    source, anchor = gguf.GGUFReader(str(tmp_path / "source.gguf")), gguf.GGUFReader(str(tmp_path / "anchor.gguf"))
    assert [t.name for t in anchor.tensors] == [t.name for t in source.tensors]
    for theirs, ours in zip(source.tensors, anchor.tensors):
        expected = gguf.quants.dequantize(theirs.data, theirs.tensor_type)
        assert ours.tensor_type == (Q.F16 if expected.ndim > 1 else Q.F32), ours.name
        np.testing.assert_array_equal(np.asarray(ours.data), expected.astype(ours.data.dtype), err_msg=ours.name)
    assert anchor.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_F16
    copied = [key for key in source.fields if not key.startswith(("GGUF.", "general.file_type"))]
    assert all(anchor.fields[key].contents() == source.fields[key].contents() for key in copied)
    assert tensor_types(str(tmp_path / "anchor.gguf")) == {"F16": 1 + 7 * NUM_LAYERS, "F32": 1 + 2 * NUM_LAYERS}


def test_divergence_counts_the_leading_ids_that_agree():
    """Positions before the first divergence: all of them for equal runs, the shorter length for a prefix."""
    assert first_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    assert first_divergence([4], [1]) == 0

def _run(ids: list[list[int]], gap: float = 1.0) -> GreedyRun:
    """A run whose every position had its token best and `gap` nats ahead of a runner-up (id 0)."""
    return GreedyRun(ids, [[[(token, -0.1), (0, -0.1 - gap * (position + 1))] for position, token in enumerate(steps)]
                           for steps in ids])


def test_agreement_counts_identical_requests_positions_and_the_anchors_gap_where_they_part():
    """Share identical, median and mean positions before divergence, and the anchor's top-2 gap at each
    first divergence (here 1 nat per position: 2 nats at the second position, 4 at the fourth)."""
    anchor = _run([[1, 2, 3, 4], [1, 2, 3, 4], [7, 8, 9, 9]])
    agreement = Agreement.of(anchor, _run([[1, 2, 3, 4], [1, 0, 0, 0], [7, 8, 9, 1]]))
    assert agreement.anchor_gaps_at_divergence == [pytest.approx(2.0), pytest.approx(4.0)]
    assert agreement.summary() == {"requests_identical": pytest.approx(1 / 3),
                                   "median_positions_before_divergence": 3.0,
                                   "mean_positions_before_divergence": pytest.approx(8 / 3),
                                   "median_anchor_gap_at_divergence": pytest.approx(3.0)}
    assert Agreement.of(anchor, anchor).summary()["median_anchor_gap_at_divergence"] is None


def test_the_table_has_a_row_per_type_with_both_servers():
    """The Markdown table: the file's tensor types, then ztgi's and llama-server's figures side by side
    (a server that failed on a type: its error's first line)."""
    figures = {"requests_identical": 0.5, "median_positions_before_divergence": 12.5,
               "mean_positions_before_divergence": 14.25, "median_anchor_gap_at_divergence": 0.0123}
    row = {"type": "Q4_K_M", "tensor_types": {"Q5_0": 3, "Q4_K": 1}, "ztgi": figures,
           "llama-server": {**figures, "requests_identical": 1.0, "median_anchor_gap_at_divergence": None}}
    failed = {**row, "type": "Q6_K", "ztgi": {"error": "RuntimeError: no | kernel\nTraceback"}}
    lines = markdown_table([row, failed]).splitlines()
    assert len(lines) == 4
    assert lines[2] == "| Q4_K_M | Q5_0 3, Q4_K 1 | 50% | 12.5 / 14.2 | 0.012 | 100% | 12.5 / 14.2 | - |"
    assert lines[3] == "| Q6_K | Q5_0 3, Q4_K 1 | failed | RuntimeError: no / kernel |  | 100% | 12.5 / 14.2 | - |"
    assert all(line.count("|") == 9 for line in lines)


def test_llama_server_runs_are_kept_by_version_file_and_requests(tmp_path):
    """A kept run is found again by a new cache on the same file, and not for another version,
    another GGUF or other requests."""
    requests = GreedyRequests([[1, 2], [3]], [4, 4])
    path = str(tmp_path / "runs.json")
    run = _run([[5, 6, 7, 8], [9, 9, 9, 9]])
    RunCache(path, "version: 1 (abc)", requests).put("/x/model-Q8_0.gguf", run)
    assert RunCache(path, "version: 1 (abc)", requests).get("/x/model-Q8_0.gguf") == run
    assert RunCache(path, "version: 2 (def)", requests).get("/x/model-Q8_0.gguf") is None
    assert RunCache(path, "version: 1 (abc)", requests).get("/x/model-Q4_0.gguf") is None
    assert RunCache(path, "version: 1 (abc)", GreedyRequests([[1, 2], [3]], [4, 5])).get("/x/model-Q8_0.gguf") is None


@needs_llama_cpp
def test_llama_quantize_makes_each_type_file_once(tiny_gguf, tmp_path):
    """The Q4_K_M file holds llama.cpp's K-quants and is made once; no partial file is left behind."""
    files = AnchorFiles(tiny_gguf, str(tmp_path), os.path.join(LLAMA_CPP_BUILD, "bin", "llama-quantize"), 1)
    path = files.make_type_file("Q4_K_M")
    assert set(tensor_types(path)) >= {"Q4_K", "Q6_K"}
    modified = os.stat(path).st_mtime_ns
    assert files.make_type_file("Q4_K_M") == path and os.stat(path).st_mtime_ns == modified
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".partial")]


@needs_llama_cpp
@pytest.mark.slow
def test_a_run_measures_both_servers_against_their_anchors(tiny_gguf, tmp_path, monkeypatch):
    """A whole run on the tiny model, one type: the JSON holds every request's ids on both servers,
    the figures agree with them, ztgi served the type's blocks as stored, and the table has the type's row."""
    output, markdown = tmp_path / "result.json", tmp_path / "table.md"
    monkeypatch.setenv("ZTGI_CACHE_DIR", str(tmp_path / "cache"))  # each temporary GGUF's tokenizer files go here
    assert gguf_agreement.main([
        "--gguf", tiny_gguf, "--types", "Q8_0", "--max-requests", "3", "--output-tokens", "6", "--num-threads", "1",
        "--work-dir", str(tmp_path / "files"), "--llama-cpp-build", LLAMA_CPP_BUILD,
        "--output", str(output), "--markdown", str(markdown)]) == 0
    result = json.loads(output.read_text())
    (row,) = result["types"]
    for server in ("ztgi", "llama-server"):
        anchor, run = (GreedyRun.from_json(runs["runs"][server]) for runs in (result["anchor"], row))
        assert len(run.ids) == 3 and all(len(ids) == 6 for ids in run.ids + anchor.ids)
        assert all(len(steps) == 6 and all(len(top2) == 2 for top2 in steps) for steps in run.top2 + anchor.top2)
        assert all(steps[0][0][0] == ids[0] for steps, ids in zip(run.top2, run.ids))  # greedy took the best
        assert row[server] == Agreement.of(anchor, run).summary()
    assert row["tensor_types"]["Q8_0"] >= 7 * NUM_LAYERS
    assert any("GGUF blocks as stored (" in note for note in row["runs"]["ztgi"]["notes"])  # --quantize gguf's default
    assert markdown.read_text().splitlines()[2].startswith("| Q8_0 |")
    anchors = Agreement.of(*(GreedyRun.from_json(result["anchor"]["runs"][s]) for s in ("ztgi", "llama-server")))
    assert result["anchor"]["ztgi_against_llama_server"] == anchors.summary()
    assert "The anchors against each other" in markdown.read_text()


def test_a_missing_llama_cpp_build_is_refused(tmp_path):
    """A build directory without llama-server is a flag error (exit 2), not a crash half-way."""
    assert gguf_agreement.main(["--llama-cpp-build", str(tmp_path)]) == 2
