"""Images over HTTP, through every process, on tiny random Idefics3 and Qwen2-VL models (float32):
OpenAI chat image parts and TGI's markdown images give transformers' greedy tokens, in one batch
with text-only requests; the same image again is a prefix cache hit; bad images get a clear 4xx and
the server serves on."""

from __future__ import annotations

import base64
import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.e2e.server import LaunchedServer
from tests.vision_models import (
    IMAGE_STRINGS,
    chat_text,
    drawn_image,
    greedy_logprobs,
    greedy_reference,
    reference_inputs,
)

NUM_TOKENS = 8
QUESTION = "What is in this picture?"
IMAGES = [drawn_image(50, 37, seed=1), drawn_image(20, 30, seed=2, image_format="JPEG")]


def data_url(image: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(image).decode()}"


def image_part(image: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(image)}}


@pytest.fixture(scope="module", params=["idefics3", "qwen2_vl"])
def served(request: pytest.FixtureRequest, vision_dirs: dict[str, str],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, LaunchedServer]]:
    family = request.param
    directory = vision_dirs[family]
    server = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--model-id", directory, "--dtype", "float32",
                            "--max-input-tokens", "1024", "--max-total-tokens", "1100",
                            "--max-batch-prefill-tokens", "1100")
    try:
        yield family, directory, server
    finally:
        assert server.stop() == 0, server.log


def _expected_chat(family: str, directory: str, images: list[bytes], question: str = QUESTION) -> list[int]:
    parts = [{"type": "image"} for _ in images] + [{"type": "text", "text": question}]
    text = chat_text(directory, [{"role": "user", "content": parts}])
    return greedy_reference(directory, reference_inputs(family, directory, text, images), NUM_TOKENS)


def _chat(server: LaunchedServer, images: list[bytes], question: str = QUESTION) -> dict[str, Any]:
    content = [image_part(image) for image in images] + [{"type": "text", "text": question}]
    response = server.post("/v1/chat/completions", {"model": "tgi", "max_tokens": NUM_TOKENS, "temperature": 0,
                                                    "messages": [{"role": "user", "content": content}]})
    assert response.status_code == 200, response.text
    return response.json()


def _text(directory: str, ids: list[int]) -> str:
    return AutoTokenizer.from_pretrained(directory).decode(ids, skip_special_tokens=True)


@pytest.mark.slow
def test_images_in_chat_and_markdown_give_transformers_tokens_beside_text_requests(
        served: tuple[str, str, LaunchedServer]) -> None:
    """One and two images in OpenAI chat, one in TGI markdown (token ids compared through
    `details`), and a text-only chat, sent at once so that they share steps."""
    family, directory, server = served
    markdown = f"Describe ![]({data_url(IMAGES[0])}) briefly."
    markdown_ids, markdown_logprobs = greedy_logprobs(directory, reference_inputs(
        family, directory, f"Describe {IMAGE_STRINGS[family]} briefly.", IMAGES[:1]), NUM_TOKENS)
    expected = {"one": _expected_chat(family, directory, IMAGES[:1]), "two": _expected_chat(family, directory, IMAGES),
                "text": _expected_chat(family, directory, [], "Tell me a story.")}

    def markdown_request() -> tuple[list[int], list[float]]:
        response = server.post("/generate", {"inputs": markdown, "parameters": {"max_new_tokens": NUM_TOKENS,
                                                                                "details": True}})
        assert response.status_code == 200, response.text
        tokens = response.json()["details"]["tokens"]
        return [token["id"] for token in tokens], [token["logprob"] for token in tokens]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        chats = {"one": pool.submit(_chat, server, IMAGES[:1]), "two": pool.submit(_chat, server, IMAGES),
                 "text": pool.submit(_chat, server, [], "Tell me a story.")}
        generated = pool.submit(markdown_request)
        answers = {name: future.result()["choices"][0]["message"]["content"] for name, future in chats.items()}
        ids, logprobs = generated.result()
        assert ids == markdown_ids
        assert logprobs == pytest.approx(markdown_logprobs, abs=1e-4)
    assert answers == {name: _text(directory, ids) for name, ids in expected.items()}


@pytest.mark.slow
def test_the_same_image_again_is_a_prefix_cache_hit_and_another_image_is_not(
        served: tuple[str, str, LaunchedServer]) -> None:
    family, directory, server = served
    first, again = _chat(server, IMAGES[:1], "Once more?"), _chat(server, IMAGES[:1], "Once more?")
    other = _chat(server, [drawn_image(50, 37, seed=7)], "Once more?")
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    block_size = server.get("/info").json()["block_size"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= (prompt_tokens - 1) // block_size * block_size
    placeholder = reference_inputs(family, directory, chat_text(directory, [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "Once more?"}]}]), IMAGES[:1])["input_ids"][0].tolist()
    image_token = AutoTokenizer.from_pretrained(directory).convert_tokens_to_ids(
        "<image>" if family == "idefics3" else "<|image_pad|>")
    first_image_token = placeholder.index(image_token)
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] <= first_image_token


@pytest.mark.slow
def test_bad_images_get_a_clear_4xx_and_the_server_serves_on(served: tuple[str, str, LaunchedServer]) -> None:
    family, directory, server = served
    corrupt = IMAGES[0][:len(IMAGES[0]) // 2]
    cases = {
        "truncated": [image_part(corrupt)],
        "not an image": [{"type": "image_url", "image_url": {"url": data_url(b"hello", "text/plain")}}],
        "too many": [image_part(IMAGES[1])] * 9,
        "not allowed": [{"type": "image_url", "image_url": {"url": "http://198.51.100.7/cat.png"}}],
    }
    for name, content in cases.items():
        response = server.post("/v1/chat/completions", {"model": "tgi", "max_tokens": 2, "messages": [
            {"role": "user", "content": [*content, {"type": "text", "text": "hi"}]}]}, timeout=10)
        assert 400 <= response.status_code < 500, (name, response.status_code, response.text)
        assert response.json()["error"], name
    bad_markdown = server.post("/generate", {"inputs": f"![]({data_url(corrupt)})", "parameters": {}})
    assert 400 <= bad_markdown.status_code < 500, bad_markdown.text
    assert _chat(server, IMAGES[:1])["choices"][0]["message"]["content"] == _text(
        directory, _expected_chat(family, directory, IMAGES[:1]))


def test_info_and_models_say_the_model_takes_images(served: tuple[str, str, LaunchedServer]) -> None:
    _, _, server = served
    assert server.get("/info").json()["vision"] is True
    assert "image" in server.get("/v1/models").json()["data"][0]["input_modalities"]
