"""Offline `LLM` with images, vLLM's way: `generate` with `multi_modal_data` on a prompt holding the
model's image placeholders, and `chat` with image parts, on tiny random Idefics3, Qwen2-VL and
Qwen2.5-VL models (float32): the same greedy tokens and logprobs as transformers, image and text
prompts in one run."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from tests.vision_models import IMAGE_STRINGS, chat_text, drawn_image, greedy_logprobs, reference_inputs
from ztgi import LLM, RequestOutput, SamplingParams

NUM_TOKENS = 6
IMAGES = [drawn_image(40, 30, seed=3), drawn_image(24, 36, seed=4)]
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module", params=["idefics3", "qwen2_vl", "qwen2_5_vl"])
def offline(request: pytest.FixtureRequest, vision_dirs: dict[str, str]) -> tuple[str, str, LLM]:
    family = request.param
    return family, vision_dirs[family], LLM(vision_dirs[family], dtype="float32")


def _pil(image: bytes) -> Image.Image:
    return Image.open(io.BytesIO(image))


def _reference(family: str, directory: str, text: str, images: list[bytes]) -> tuple[list[int], list[float]]:
    return greedy_logprobs(directory, reference_inputs(family, directory, text, images), NUM_TOKENS)


def _greedy(output: RequestOutput) -> tuple[list[int], list[float]]:
    """The ids and the logprob of each."""
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    assert completion.logprobs is not None
    return ids, [step[token].logprob for token, step in zip(ids, completion.logprobs)]




def test_generate_with_multi_modal_data_beside_a_text_prompt(offline: tuple[str, str, LLM]) -> None:
    family, directory, llm = offline
    image = IMAGE_STRINGS[family]
    prompts = [{"prompt": f"Look: {image} and {image}.", "multi_modal_data": {"image": [_pil(i) for i in IMAGES]}},
               {"prompt": f"{image}What is this?", "multi_modal_data": {"image": IMAGES[1]}},
               "A story about a clock:"]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    expected = [_reference(family, directory, f"Look: {image} and {image}.", IMAGES),
                _reference(family, directory, f"{image}What is this?", IMAGES[1:]),
                _reference(family, directory, "A story about a clock:", [])]
    for output, reference in zip(outputs, expected):
        assert output.outputs[0].token_ids == reference[0]
        assert _greedy(output)[1] == pytest.approx(reference[1], abs=1e-4)


def test_chat_with_image_parts(offline: tuple[str, str, LLM]) -> None:
    family, directory, llm = offline
    url = "data:image/png;base64," + base64.b64encode(IMAGES[0]).decode()
    conversation = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                 {"type": "text", "text": "Describe it."},
                                                 {"type": "image_pil", "image_pil": _pil(IMAGES[1])}]}]
    output = llm.chat(conversation, GREEDY, use_tqdm=False)[0]
    parts = [{"type": "image"}, {"type": "text", "text": "Describe it."}, {"type": "image"}]
    text = chat_text(directory, [{"role": "user", "content": parts}])
    ids, logprobs = _reference(family, directory, text, IMAGES)
    assert output.outputs[0].token_ids == ids
    assert _greedy(output)[1] == pytest.approx(logprobs, abs=1e-4)


def test_bad_images_are_named_before_any_work(offline: tuple[str, str, LLM]) -> None:
    family, _, llm = offline
    image = IMAGE_STRINGS[family]
    with pytest.raises(ValueError, match="prompt 0: .*image 1"):
        llm.generate({"prompt": f"{image}?", "multi_modal_data": {"image": IMAGES[0][:40]}}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="image placeholders"):
        llm.generate({"prompt": "no placeholder", "multi_modal_data": {"image": IMAGES[0]}}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="data: URL"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x.org/a.png"}}]}],
                 GREEDY, use_tqdm=False)
    assert llm.generate("Still here:", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
