"""The tokenizer process runs without torch (`without_torch.py`): what it makes of a prompt, text or
images, equals what the same code makes with torch loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ztgi.common.messages import ChatMessage, ContentPart, Generate, GenerateParameters
from ztgi.common.parameters import ParameterLimits
from ztgi.services.tokenizer.encoder import Encoder
from ztgi.services.tokenizer.loading import load_tokenizer, load_vision_processor

TEXT = "Hello world, 中文 😀 <|im_start|> def f(x):\n\treturn x"


def encoded(directory: str, images: list[bytes]) -> dict:
    """The prompt ids and image digests of a chat with `images` (and of plain text), as JSON."""
    tokenizer = load_tokenizer(directory)
    encoder = Encoder(tokenizer, ParameterLimits(), b"tokenizer-test", load_vision_processor(directory, tokenizer),
                      "model")
    parts = [ContentPart("image", image=data) for data in images] + [ContentPart("text", "What is this?")]
    chat = Generate("r1", None, [ChatMessage("user", "What is this?", parts=parts)], GenerateParameters())
    ids, encoded_images = encoder.prompt(chat)
    text_ids, _ = encoder.prompt(Generate("r2", TEXT, None, GenerateParameters()))
    return {"chat": ids, "images": [image.digest.hex() for image in encoded_images], "text": text_ids,
            "torch": sys.modules.get("torch") is not None}


def encoded_without_torch(directory: str, images: list[bytes]) -> dict:
    """`encoded` in a new process that keeps torch out, as the tokenizer service's does."""
    script = ("import json, sys\n"
              "from ztgi.services.tokenizer.without_torch import keep_torch_out\n"
              "keep_torch_out()\n"
              "from tests.tokenizer.test_without_torch import encoded\n"
              "arguments = json.load(sys.stdin)\n"
              "print(json.dumps(encoded(arguments['directory'], [bytes.fromhex(i) for i in arguments['images']])))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          input=json.dumps({"directory": directory, "images": [data.hex() for data in images]}))
    assert done.returncode == 0, done.stderr
    assert "PyTorch was not found" not in done.stderr  # transformers' notice is expected, and kept quiet
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("family", ["text", "idefics3", "qwen2_vl"])
def test_prompts_equal_with_and_without_torch(family: str, smollm2, vision_dirs: dict[str, str]) -> None:
    from tests.vision_models import drawn_image  # imports torch: not at the top, the child imports this module

    directory = smollm2.path if family == "text" else vision_dirs[family]
    images = [] if family == "text" else [drawn_image(50, 37, 1), drawn_image(20, 30, 2)]
    with_torch = encoded(directory, images)
    without = encoded_without_torch(directory, images)
    assert with_torch.pop("torch") and not without.pop("torch")
    assert without == with_torch
    assert len(without["images"]) == len(images)


def load_without_torch(model_id: str, cache_dir: str) -> subprocess.CompletedProcess:
    """A process that keeps torch out loads `model_id`'s tokenizer, with an empty ztgi cache."""
    script = ("import sys\n"
              "from ztgi.services.tokenizer.without_torch import keep_torch_out\n"
              "keep_torch_out()\n"
              "from ztgi.services.tokenizer.loading import load_tokenizer\n"
              "print(load_tokenizer(sys.argv[1])('The capital of France is')['input_ids'])\n"
              "assert sys.modules['torch'] is None\n")
    return subprocess.run([sys.executable, "-c", script, model_id], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ZTGI_CACHE_DIR": cache_dir})


def test_a_gguf_seen_first_is_converted_in_a_child_with_torch(smollm2, tokenizer, tmp_path) -> None:
    """Reading a GGUF's tokenizer takes transformers' GGUF reader, which needs torch: a tokenizer that
    meets a file first converts it in a child process, then loads the result without torch."""
    done = load_without_torch(smollm2.gguf_file, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == tokenizer("The capital of France is")["input_ids"]
    assert len(os.listdir(tmp_path / "models")) == 1  # the converted directory, read by the worker too


def test_a_bad_gguf_is_refused_in_words(smollm2, tmp_path) -> None:
    truncated = tmp_path / "truncated.gguf"
    with open(smollm2.gguf_file, "rb") as source:
        truncated.write_bytes(source.read(100_000))
    done = load_without_torch(str(truncated), str(tmp_path / "cache"))
    assert done.returncode != 0
    assert f"ModelNotFoundError: {truncated} is truncated: it ends inside its header" in done.stderr, done.stderr
