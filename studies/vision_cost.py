"""What one image costs: preprocessing at the edge (the tokenizer service) and the vision encoder in
the worker's step, for SmolVLM-256M's and Qwen2-VL-2B's vision towers at their processors' default
resolutions.

    python -m studies.vision_cost --repeats 3

Each family's model is written with random weights: the vision tower and projector of the released
checkpoint's shape (SmolVLM-256M: SigLIP 768 wide, 12 layers, 512-pixel tiles of 16-pixel patches,
pixel shuffle 4; Qwen2-VL-2B: 32 layers 1280 wide, 14-pixel patches merged 2x2) and a one-layer text
model of the checkpoint's width (the text side is the step's usual cost, measured elsewhere); the
image processor with the checkpoint's defaults (SmolVLM: longest edge 2048, 512-pixel tiles;
Qwen2-VL: 3136 to 12845056 pixels); SmolLM2's tokenizer with the family's image tokens. The image: a
640x480 photo-like PNG. Edge: the tokenizer's `Encoder.encode` of a chat with that image (decode,
processor, placeholder expansion, spans and digest), its tokens and the tensor bytes it sends.
Worker: the vision encoder's `encode` of that image in bfloat16 (the CPU default), its time and the
peak of the process's resident memory above where it stood before (sampled every millisecond).
Each family runs in a process of its own; medians of `--repeats` (memory: the smallest, as the
first encode also pages in the weights that loading left mapped).
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from typing import Any

import torch
from PIL import Image

from ztgi.common.messages import ChatMessage, ContentPart, Generate, GenerateParameters, RequestKey
from ztgi.common.model_source import resolve_model
from ztgi.common.parameters import ParameterLimits

FAMILIES = ("smolvlm", "qwen2_vl")
IMAGE_SIZE = (640, 480)


def photo(width: int, height: int) -> bytes:
    """A smooth picture with noise (compresses like a photo, unlike flat synthetic shapes), as PNG."""
    generator = torch.Generator().manual_seed(0)
    y, x = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")
    channels = torch.stack([x, y, (x + y) / 2]) * 200 + torch.rand((3, height, width), generator=generator) * 55
    array = channels.clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _tokenizer(tokens: list[str]) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model().path)
    tokenizer.add_special_tokens({"additional_special_tokens": tokens}, replace_extra_special_tokens=False)
    return tokenizer


def write_smolvlm(directory: str) -> None:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil

    rows = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    tokenizer = _tokenizer(["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>", *rows])
    config = Idefics3Config(
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), scale_factor=4,
        vision_config={"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                       "num_attention_heads": 12, "image_size": 512, "patch_size": 16},
        text_config={"model_type": "llama", "vocab_size": -(-len(tokenizer) // 64) * 64, "hidden_size": 576,
                     "intermediate_size": 1536, "num_hidden_layers": 1, "num_attention_heads": 9,
                     "num_key_value_heads": 3})
    model = Idefics3ForConditionalGeneration(config)
    model.to(dtype=torch.bfloat16)  # type: ignore[call-arg]  # transformers' stub misreads nn.Module.to
    model.save_pretrained(directory)
    processor = Idefics3ImageProcessorPil(size={"longest_edge": 2048}, max_image_size={"longest_edge": 512})
    processor.save_pretrained(directory)
    with open(os.path.join(directory, "processor_config.json"), "w") as file:
        json.dump({"image_seq_len": 64, "processor_class": "Idefics3Processor"}, file)
    tokenizer.chat_template = CHATML_WITH_IMAGES
    tokenizer.save_pretrained(directory)


def write_qwen2_vl(directory: str) -> None:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil

    tokenizer = _tokenizer(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2VLConfig(
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        text_config={"vocab_size": -(-len(tokenizer) // 64) * 64, "hidden_size": 1536, "intermediate_size": 1536,
                     "num_hidden_layers": 1, "num_attention_heads": 12, "num_key_value_heads": 2,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                         "mrope_section": [16, 24, 24]}},
        vision_config={"depth": 32, "embed_dim": 1280, "hidden_size": 1536, "num_heads": 16, "mlp_ratio": 4,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2})
    model = Qwen2VLForConditionalGeneration(config)
    model.to(dtype=torch.bfloat16)  # type: ignore[call-arg]  # transformers' stub misreads nn.Module.to
    model.save_pretrained(directory)
    Qwen2VLImageProcessorPil().save_pretrained(directory)
    tokenizer.chat_template = CHATML_WITH_IMAGES.replace("<image>", "<|vision_start|><|image_pad|><|vision_end|>")
    tokenizer.save_pretrained(directory)


CHATML_WITH_IMAGES = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% else %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _rss_mib() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class RssPeak:
    """The process's resident memory sampled every millisecond while in the block: its peak above
    where it started (the encoder's working memory; the weights were resident before)."""

    def __enter__(self) -> RssPeak:
        self.start = self.peak = _rss_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _rss_mib())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mib(self) -> float:
        return self.peak - self.start


def measure(family: str, directory: str, repeats: int) -> dict[str, float]:
    """One family's figures, in this process (a fresh one per family: peak memory is per process)."""
    from ztgi.services.tokenizer.encoder import Encoder
    from ztgi.services.tokenizer.loading import load_tokenizer, load_vision_processor
    from ztgi.services.worker.models.loading import load

    torch.set_num_threads(os.cpu_count() or 1)
    tokenizer = load_tokenizer(directory)
    encoder = Encoder(tokenizer, ParameterLimits(max_input_tokens=16000, max_total_tokens=16384), b"study",
                      load_vision_processor(directory, tokenizer), model_name=family)
    image = photo(*IMAGE_SIZE)
    turn = ChatMessage("user", "What is this?", parts=[ContentPart("image", image=image),
                                                       ContentPart("text", "What is this?")])
    edge_ms, encoded = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        encoded = encoder.encode(RequestKey(b"c", "r"), Generate("r", None, [turn], GenerateParameters(
            max_new_tokens=1)))
        edge_ms.append((time.perf_counter() - started) * 1000)
    assert encoded is not None and len(encoded.images) == 1
    encoded_image = encoded.images[0]
    loaded = load(directory, dtype="bfloat16", device="cpu")
    assert loaded.vision is not None
    encoder_ms, growth = [], []
    with torch.inference_mode():
        for _ in range(repeats):
            with RssPeak() as memory:
                started = time.perf_counter()
                rows = loaded.vision.encode(encoded_image)
                encoder_ms.append((time.perf_counter() - started) * 1000)
            growth.append(memory.growth_mib)
    assert rows.shape[0] == encoded_image.num_tokens
    return {"edge_ms": statistics.median(edge_ms), "encoder_ms": statistics.median(encoder_ms),
            "image_tokens": encoded_image.num_tokens, "prompt_tokens": len(encoded.input_ids),
            "tensor_mib": sum(len(t.data) for t in encoded_image.tensors) / 2**20,
            "encoder_peak_growth_mib": min(growth)}


def _run(family: str, directory: str, repeats: int, queue: Any) -> None:
    queue.put(measure(family, directory, repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    writers = {"smolvlm": write_smolvlm, "qwen2_vl": write_qwen2_vl}
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as root:
        for family in FAMILIES:
            directory = os.path.join(root, family)
            torch.manual_seed(0)
            writers[family](directory)
            queue = context.Queue()
            process = context.Process(target=_run, args=(family, directory, args.repeats, queue))
            process.start()
            figures = queue.get()
            process.join()
            print(f"{family} {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}: " + ", ".join(
                f"{name} {value:.1f}" if isinstance(value, float) else f"{name} {value}"
                for name, value in figures.items()), flush=True)


if __name__ == "__main__":
    main()
