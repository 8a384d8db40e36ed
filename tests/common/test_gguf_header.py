"""A GGUF file that cannot be served is refused at start, naming the tensor, its type and the fault."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from ztgi.common.gguf_header import check_gguf, read_gguf_header
from ztgi.common.model_source import ModelNotFoundError, embedded_gguf_path, resolve_model


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache of this test's own: a refused file must never be converted into it."""
    monkeypatch.setenv("ZTGI_CACHE_DIR", str(tmp_path / "cache"))


def _tiny_gguf(path: Path, architecture: str = "llama", q_out: int = 64) -> Path:
    """A two-tensor GGUF whose hyperparameters say 64 wide, 4 heads of 16."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_feed_forward_length(128)
    writer.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((q_out, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(ModelNotFoundError) as refused:
        resolve_model(str(path))
    assert not list(Path(os.environ["ZTGI_CACHE_DIR"]).glob("models/*"))  # nothing was converted
    return str(refused.value)


def test_the_embedded_file_reads_as_gguf_reads_it() -> None:
    """The header of the embedded GGUF: every tensor the gguf library lists, with its type and dims."""
    header = check_gguf(embedded_gguf_path())
    reference = gguf.GGUFReader(embedded_gguf_path())
    assert header.architecture == "llama"
    assert [(t.name, t.type_id, t.dims) for t in header.tensors] == [
        (t.name, int(t.tensor_type), tuple(int(d) for d in t.shape)) for t in reference.tensors]
    assert header.data_offset == reference.data_offset
    assert [header.data_offset + t.offset for t in header.tensors] == [int(t.data_offset) for t in reference.tensors]


def test_a_truncated_file_names_the_first_tensor_cut_off(tmp_path: Path) -> None:
    """Cut at 50 MB: the first tensor whose data runs past the end, its type and both sizes."""
    path = tmp_path / "cut.gguf"
    with open(embedded_gguf_path(), "rb") as source, open(path, "wb") as target:
        target.write(source.read(50_000_000))
    message = _refusal(path)
    assert "is truncated: tensor 'blk." in message and "(Q4_1, dims" in message and "the file has 50000000" in message


def test_a_file_cut_inside_its_header_or_not_gguf(tmp_path: Path) -> None:
    """A file that ends within its metadata, and one that is not GGUF at all."""
    cut = tmp_path / "header.gguf"
    cut.write_bytes(Path(embedded_gguf_path()).read_bytes()[:4000])
    assert "ends inside its header" in _refusal(cut)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(100))
    assert "is not a GGUF file" in _refusal(other)


def test_an_architecture_nothing_here_loads(tmp_path: Path) -> None:
    """An architecture transformers' GGUF loader does not read is named, with the ones it does."""
    message = _refusal(_tiny_gguf(tmp_path / "odd.gguf", architecture="notamodel"))
    assert "architecture 'notamodel' cannot be served" in message and "llama" in message


def test_a_tensor_of_the_wrong_shape(tmp_path: Path) -> None:
    """A query projection 48 wide where 4 heads of 16 make 64: the tensor, its type, both shapes."""
    message = _refusal(_tiny_gguf(tmp_path / "shape.gguf", q_out=48))
    assert "tensor 'blk.0.attn_q.weight' (F32) has dims [64, 48]" in message and "make it [64, 64]" in message


def test_a_type_the_gguf_library_does_not_know(tmp_path: Path) -> None:
    """A tensor whose type id no ggml type has: named, not read as something else."""
    path = _tiny_gguf(tmp_path / "type.gguf")
    data = bytearray(path.read_bytes())
    name = b"blk.0.attn_q.weight"
    type_at = data.index(name) + len(name) + 4 + 2 * 8  # after the name: n_dims, two dims
    data[type_at:type_at + 4] = (250).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert read_gguf_header(str(path)).tensors[1].type_id == 250
    assert "tensor 'blk.0.attn_q.weight' has type id 250, which this gguf library does not know" in _refusal(path)


def test_the_worker_exits_non_zero_naming_the_tensor(tmp_path: Path) -> None:
    """`ztgi worker` on a truncated GGUF: exit code 1 at start, the log line names the tensor and type."""
    path = tmp_path / "cut.gguf"
    shutil.copyfile(embedded_gguf_path(), path)
    os.truncate(path, os.path.getsize(path) - 1000)
    completed = subprocess.run(
        [sys.executable, "-m", "ztgi.services.worker", "--model-id", str(path), "--scheduler-url",
         f"ipc://{tmp_path}/run"], capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == 1
    last = max(check_gguf(embedded_gguf_path()).tensors, key=lambda tensor: tensor.offset)
    assert f"cannot load {path}: {path} is truncated: tensor {last.name!r} ({last.type_name}" in completed.stderr
