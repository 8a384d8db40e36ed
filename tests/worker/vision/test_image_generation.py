"""Images through the paged engine: greedy ids equal transformers' `generate` on the processor's inputs,
whole or chunked, alone or beside text-only requests, resumed inside an image's span or after it."""

from __future__ import annotations

import dataclasses

import pytest

from tests.worker.engine_helpers import batch_of, request, run_chunked, run_to_end, token_ids
from tests.worker.vision.image_prompts import ImagePrompt, image_prompt, pictures, reference_ids
from ztgi.common.messages import WorkerRequest

MAX_NEW_TOKENS = 8


def _request(seq_id: int, prompt: ImagePrompt, **fields: object) -> WorkerRequest:
    fields = {"images": prompt.images, **fields}
    return dataclasses.replace(request(seq_id, prompt.input_ids, MAX_NEW_TOKENS, ignore_eos=True), **fields)


@pytest.fixture(scope="module")
def prompts(family, family_dir) -> dict[str, ImagePrompt]:
    two = pictures(2)
    return {"one": image_prompt(family, family_dir, two[:1]), "two": image_prompt(family, family_dir, two),
            "text": image_prompt(family, family_dir, [], "Tell me a story.")}


@pytest.fixture(scope="module")
def expected(vision_reference, prompts) -> dict[str, list[int]]:
    return {name: reference_ids(vision_reference, prompt, MAX_NEW_TOKENS) for name, prompt in prompts.items()}


def test_one_and_two_images_and_text_in_one_batch(vision_model, prompts, expected):
    """One image, two images and a text-only prompt stepped together: each equals `generate` alone."""
    requests = [_request(i, prompts[name]) for i, name in enumerate(("one", "two", "text"))]
    got = token_ids(run_to_end(vision_model, batch_of(vision_model, requests)))
    assert [got[0], got[1], got[2]] == [expected["one"], expected["two"], expected["text"]]
    assert expected["one"] != expected["two"]  # the images are read: a second one changes the answer


def test_the_images_rows_are_used(vision_model, prompts, expected):
    """The same ids without their images (placeholders embedded as text) answer differently."""
    got = token_ids(run_to_end(vision_model, batch_of(vision_model, [_request(1, prompts["two"], images=[])])))
    assert got[1] != expected["two"]


@pytest.mark.parametrize("chunk", [3, 7])
def test_chunks_split_the_image_spans(vision_model, prompts, expected, chunk):
    """Chunked prefill with boundaries inside each image's span equals the whole prefill."""
    prompt = prompts["two"]
    assert any(image.start % chunk and image.start // chunk < (image.end - 1) // chunk for image in prompt.images)
    got = token_ids(run_chunked(vision_model, [_request(1, prompt), _request(2, prompts["text"])], chunk))
    assert (got[1], got[2]) == (expected["two"], expected["text"])


@pytest.mark.parametrize("where", ["inside", "after"])
def test_a_request_resumes_from_cached_blocks(vision_model, prompts, expected, where):
    """A second identical request whose cached prefix (the first one's blocks) ends inside the
    second image's span (encoded again, only its remaining rows used) or after it (no image
    encoded; Qwen2-VL's positions still the images'): the same tokens."""
    prompt = prompts["two"]
    block_size = vision_model.block_size
    first = batch_of(vision_model, [_request(1, prompt)])
    assert token_ids(run_to_end(vision_model, first))[1] == expected["two"]
    image = prompt.images[1]
    cache_len = (image.start + image.num_tokens // 2 if where == "inside" else image.end + block_size - 1)
    cache_len = cache_len // block_size * block_size
    assert (image.start < cache_len < image.end) if where == "inside" else image.end <= cache_len
    blocks = first.sequences[0].block_ids
    fresh = [b + len(blocks) for b in blocks]  # the tests' pool is large: blocks past the first's are free
    resumed = _request(2, prompt, cache_len=cache_len,
                       block_ids=blocks[:cache_len // block_size] + fresh[cache_len // block_size:])
    assert token_ids(run_to_end(vision_model, batch_of(vision_model, [resumed])))[2] == expected["two"]


def test_a_resumed_request_continues_its_positions(vision_model, prompts, expected):
    """A request resumed with three generated tokens in its input (`num_generated`) continues with
    the rest of the tokens (Qwen2-VL: the generated ones at t + delta)."""
    prompt = prompts["two"]
    resumed = dataclasses.replace(request(1, prompt.input_ids + expected["two"][:3], MAX_NEW_TOKENS - 3,
                                          ignore_eos=True), images=prompt.images, num_generated=3)
    assert token_ids(run_to_end(vision_model, batch_of(vision_model, [resumed])))[1] == expected["two"][3:]


def test_speculation_keeps_the_tokens(family, family_dir, prompts, expected):
    """Prompt-lookup drafts verified after an image prompt (Qwen2-VL: at t + delta) keep `generate`'s tokens."""
    from ztgi.services.worker.model_loader import load_model

    model = load_model(family_dir, dtype="float32", device="cpu", kv_cache="paged", block_size=4, speculate=3)
    model.allocate_pool(128)
    batch = batch_of(model, [_request(1, prompts["two"]), _request(2, prompts["text"])])
    got, num_accepted = {}, 0
    while batch is not None:
        generations, batch, timings = model.generate_token(batch)
        num_accepted += timings.num_accepted
        for generation in generations:
            got.setdefault(generation.seq_id, []).append(generation.token_id)
    assert (got[1], got[2]) == (expected["two"], expected["text"])
    assert num_accepted > 0 or family != "qwen2_vl"  # its answer repeats: drafts at t + delta are accepted
