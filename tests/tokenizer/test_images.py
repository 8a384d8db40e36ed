"""Images at the tokenizer: ids and tensors equal transformers' processors', spans, digests,
truncation, and every bad image refused with a message that names it."""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import numpy as np
import pytest
from PIL import Image
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer, PreTrainedTokenizerBase

from tests.vision_models import drawn_image
from ztgi.common.messages import (
    ChatMessage,
    ContentPart,
    Encoded,
    EncodedImage,
    Generate,
    GenerateParameters,
    RawTensor,
    RequestKey,
)
from ztgi.common.parameters import ParameterLimits, ValidationError
from ztgi.services.tokenizer import vision_processor
from ztgi.services.tokenizer.encoder import Encoder
from ztgi.services.tokenizer.loading import load_tokenizer, load_vision_processor

KEY = RequestKey(b"gateway-0", "r1")
FAMILIES = ("idefics3", "qwen2_vl")
IMAGE_STRINGS = {"idefics3": "<image>", "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>"}
PICTURES = [drawn_image(50, 37, 1), drawn_image(20, 30, 2)]


def _encoder(directory: str, **limits: int) -> Encoder:
    tokenizer = load_tokenizer(directory)
    max_image_pixels = limits.pop("max_image_pixels", 4096 * 4096)
    vision = load_vision_processor(directory, tokenizer, max_image_pixels)
    return Encoder(tokenizer, ParameterLimits(**limits), b"tokenizer-test", vision, "tiny-vlm")


@pytest.fixture(scope="module")
def encoders(vision_dirs: dict[str, str]) -> dict[str, Encoder]:
    """Each family's encoder, built once."""
    return {family: _encoder(directory) for family, directory in vision_dirs.items()}


@pytest.fixture(scope="module")
def references(vision_dirs: dict[str, str]) -> dict[str, Any]:
    """What transformers itself makes of a prompt: Idefics3's processor; Qwen2-VL's image processor
    and tokenizer, with the placeholder expanded as its processor documents."""
    return {"idefics3": AutoProcessor.from_pretrained(vision_dirs["idefics3"], backend="pil"),
            "qwen2_vl": (AutoImageProcessor.from_pretrained(vision_dirs["qwen2_vl"], backend="pil"),
                         AutoTokenizer.from_pretrained(vision_dirs["qwen2_vl"]))}


def _pil(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def _reference(family: str, references: dict[str, Any], text: str, files: list[bytes],
               add_special_tokens: bool) -> tuple[list[int], list[dict[str, np.ndarray]]]:
    """transformers' ids for `text` (placeholders not yet expanded) and each image's tensors alone."""
    images = [_pil(data) for data in files]
    if family == "idefics3":
        processor = references[family]
        ids = processor(text=text, images=[images], add_special_tokens=add_special_tokens)["input_ids"][0]
        alone = [processor.image_processor([[image]], return_tensors="np") for image in images]
        # the mask travels as bool: the same values in an eighth of int64's bytes
        return list(ids), [{"pixel_values": out["pixel_values"], "pixel_attention_mask": out["pixel_attention_mask"]
                            .astype(bool)} for out in alone]
    image_processor, tokenizer = references[family]
    alone = [dict(image_processor([image], return_tensors="np")) for image in images]
    pieces = text.split("<|image_pad|>")
    merge = image_processor.merge_size ** 2
    expanded = pieces[0] + "".join("<|image_pad|>" * int(out["image_grid_thw"].prod() // merge) + piece
                                   for out, piece in zip(alone, pieces[1:]))
    return tokenizer(expanded, add_special_tokens=add_special_tokens)["input_ids"], alone


def _array(tensor: RawTensor) -> np.ndarray:
    dtypes = {"float32": np.float32, "int64": np.int64, "bool": np.bool_}
    return np.frombuffer(tensor.data, dtype=np.dtype(dtypes[tensor.dtype]).newbyteorder("<")).reshape(tensor.shape)


def _check_spans(encoded: Encoded, image_token_id: int) -> None:
    """Spans in order, each starting and ending on a placeholder and holding exactly its own."""
    ids = np.array(encoded.input_ids)
    end = 0
    for image in encoded.images:
        assert end <= image.start < image.end <= len(ids)
        assert ids[image.start] == ids[image.end - 1] == image_token_id
        assert int((ids[image.start:image.end] == image_token_id).sum()) == image.num_tokens
        end = image.end
    assert int((ids == image_token_id).sum()) == sum(image.num_tokens for image in encoded.images)


def _check_tensors(images: list[EncodedImage], expected: list[dict[str, np.ndarray]]) -> None:
    assert len(images) == len(expected)
    for image, reference in zip(images, expected):
        assert [tensor.name for tensor in image.tensors] == list(reference)
        for tensor in image.tensors:
            assert _array(tensor).dtype == reference[tensor.name].dtype
            np.testing.assert_array_equal(_array(tensor), reference[tensor.name])


def _chat(files: list[bytes]) -> list[ChatMessage]:
    parts = [ContentPart("image", image=files[0]), ContentPart("text", "What is this?")]
    parts += [ContentPart("image", image=data) for data in files[1:]]
    return [ChatMessage("system", "Be brief."), ChatMessage("user", "What is this?", parts=parts)]


def _template_content(files: list[bytes]) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = [{"type": "image"}, {"type": "text", "text": "What is this?"}]
    return [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": content + [{"type": "image"}] * (len(files) - 1)}]


def _generate(inputs: str | None = None, messages: list[ChatMessage] | None = None,
              images: list[bytes] | None = None, **parameters: Any) -> Generate:
    parameters.setdefault("max_new_tokens", 4)
    return Generate("r1", inputs, messages, GenerateParameters(**parameters), images=images)


@pytest.mark.parametrize("num_images", (1, 2))
@pytest.mark.parametrize("family", FAMILIES)
def test_chat_images_equal_transformers(family: str, num_images: int, encoders: dict[str, Encoder],
                                        references: dict[str, Any]) -> None:
    """A chat turn's images: ids and per-image tensors are the family's processor's."""
    encoder, files = encoders[family], PICTURES[:num_images]
    encoded = encoder.encode(KEY, _generate(messages=_chat(files)))
    tokenizer: PreTrainedTokenizerBase = encoder.tokenizer
    text = tokenizer.apply_chat_template(_template_content(files), add_generation_prompt=True, tokenize=False)
    ids, tensors = _reference(family, references, str(text), files, add_special_tokens=False)
    assert encoded.input_ids == ids
    _check_tensors(encoded.images, tensors)
    assert encoder.vision is not None
    _check_spans(encoded, encoder.vision.image_token_id)


@pytest.mark.parametrize("num_images", (1, 2))
@pytest.mark.parametrize("family", FAMILIES)
def test_markdown_images_equal_transformers(family: str, num_images: int, encoders: dict[str, Encoder],
                                            references: dict[str, Any]) -> None:
    """TGI's `![](url)` images in `inputs`: each becomes the family's image string, then the same."""
    files = PICTURES[:num_images]
    inputs = "Look: ![a](https://x/a.png) and" + " ![b](data:image/png;base64,AAAA) too" * (num_images - 1)
    encoded = encoders[family].encode(KEY, _generate(inputs, images=files))
    text = IMAGE_STRINGS[family].join(["Look: ", " and"] if num_images == 1 else ["Look: ", " and ", " too"])
    ids, tensors = _reference(family, references, text, files, add_special_tokens=True)
    assert encoded.input_ids == ids
    _check_tensors(encoded.images, tensors)


@pytest.mark.parametrize("family", FAMILIES)
def test_inputs_with_the_model_placeholders(family: str, encoders: dict[str, Encoder]) -> None:
    """`inputs` holding the family's own image string (offline prompts, vLLM's style) equal markdown."""
    encoder = encoders[family]
    own = encoder.encode(KEY, _generate(f"Look: {IMAGE_STRINGS[family]} and", images=[PICTURES[0]]))
    markdown = encoder.encode(KEY, _generate("Look: ![](a) and", images=[PICTURES[0]]))
    assert (own.input_ids, own.images) == (markdown.input_ids, markdown.images)


def test_idefics3_tiles_concatenate_to_the_batch(encoders: dict[str, Encoder], references: dict[str, Any]) -> None:
    """Idefics3's per-image tiles, concatenated, are the processor's tensors for the whole prompt."""
    encoded = encoders["idefics3"].encode(KEY, _generate("![](a)![](b)", images=PICTURES))
    batch = references["idefics3"](text="<image><image>", images=[[_pil(d) for d in PICTURES]], return_tensors="np")
    pixels = np.concatenate([_array(image.tensors[0]) for image in encoded.images], axis=1)
    np.testing.assert_array_equal(pixels, batch["pixel_values"])


@pytest.mark.parametrize("family", FAMILIES)
def test_digest_names_the_pixels(family: str, encoders: dict[str, Encoder]) -> None:
    """The same image twice has one digest; another image has another."""
    files = [PICTURES[0], PICTURES[1], PICTURES[0]]
    encoded = encoders[family].encode(KEY, _generate("![](a) ![](b) ![](a)", images=files))
    first, second, again = (image.digest for image in encoded.images)
    assert len(first) == 16 and first == again and first != second


@pytest.mark.parametrize("family", FAMILIES)
def test_truncation_drops_whole_images_and_refuses_a_cut_through_one(family: str,
                                                                     encoders: dict[str, Encoder]) -> None:
    """`truncate` keeps the last tokens: an image cut away entirely goes, the rest move back."""
    encoder = encoders[family]
    inputs = "A ![](a) then ![](b) end"
    whole = encoder.encode(KEY, _generate(inputs, images=PICTURES))
    first, second = whole.images
    keep = len(whole.input_ids) - first.end  # cut right after the first image
    truncated = encoder.encode(KEY, _generate(inputs, images=PICTURES, truncate=keep))
    assert truncated.input_ids == whole.input_ids[first.end:]
    assert [(i.start, i.end, i.digest) for i in truncated.images] == [(second.start - first.end,
                                                                       second.end - first.end, second.digest)]
    through = len(whole.input_ids) - second.start - 1  # the cut falls after the second image's first token
    with pytest.raises(ValidationError, match=f"`truncate` {through} cuts through image 2"):
        encoder.encode(KEY, _generate(inputs, images=PICTURES, truncate=through))


def test_length_limits_count_image_tokens(vision_dirs: dict[str, str]) -> None:
    """A short text with an image is as long as its placeholders make it."""
    encoder = _encoder(vision_dirs["qwen2_vl"], max_input_tokens=10, max_total_tokens=20)
    with pytest.raises(ValidationError, match="`inputs` must have less than 10 tokens"):
        encoder.encode(KEY, _generate("![](a)", images=[PICTURES[0]]))


def _file(image: Image.Image, image_format: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    return buffer.getvalue()


@pytest.mark.parametrize("image_format", ("JPEG", "WEBP", "GIF"))
def test_other_formats_are_taken(image_format: str, encoders: dict[str, Encoder]) -> None:
    """JPEG, WebP and GIF files are decoded like PNG (a GIF's first frame)."""
    frames = [_pil(PICTURES[0]), _pil(drawn_image(50, 37, 9))]
    data = _file(frames[0], image_format, save_all=True, append_images=frames[1:]) if image_format == "GIF" \
        else _file(frames[0], image_format)
    encoded = encoders["qwen2_vl"].encode(KEY, _generate("![](a)", images=[data]))
    first_frame = _file(_pil(data), "PNG")
    assert encoded.images[0].digest == encoders["qwen2_vl"].encode(KEY, _generate("![](a)", images=[first_frame])
                                                                   ).images[0].digest


BAD_FILES = {
    "corrupt": (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "image 2 is not a readable image file"),
    "truncated": (PICTURES[0][: len(PICTURES[0]) // 2], "image 2 is corrupt or truncated"),
    "bmp": (_file(_pil(PICTURES[1]), "BMP"), "image 2 is a BMP file, a format this server does not take"),
    "empty": (b"", "image 2 is not a readable image file"),
}


@pytest.mark.parametrize("case", BAD_FILES)
@pytest.mark.parametrize("family", FAMILIES)
def test_bad_files_are_refused_by_number(family: str, case: str, encoders: dict[str, Encoder]) -> None:
    """A file that is not a PNG, JPEG, WebP or GIF picture is the client's error, naming which."""
    data, message = BAD_FILES[case]
    with pytest.raises(ValidationError, match=message):
        encoders[family].encode(KEY, _generate(messages=_chat([PICTURES[0], data])))


def test_too_many_pixels_are_refused_before_decoding(vision_dirs: dict[str, str]) -> None:
    """--max-image-pixels is checked on the header."""
    encoder = _encoder(vision_dirs["idefics3"], max_image_pixels=1000)
    with pytest.raises(ValidationError, match=r"image 1 has 50x37 = 1850 pixels, more than the 1000 .*"
                                              r"--max-image-pixels"):
        encoder.encode(KEY, _generate("![](a)", images=[PICTURES[0]]))


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` pixels and whose pixels never come."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = chunk(b"IDAT", zlib.compress(bytes(64)))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + pixels + chunk(b"IEND", b"")


@pytest.mark.parametrize(("side", "message"), ((5000, "image 1 has 5000x5000 = 25000000 pixels, more than the "
                                                      "16777216"),
                                               (100_000, "image 1 has too many pixels")))
def test_a_decompression_bomb_is_refused_on_its_header(side: int, message: str,
                                                       encoders: dict[str, Encoder]) -> None:
    """The default limit (4096 x 4096) refuses an image on its header, as PIL's own bomb check beyond it."""
    with pytest.raises(ValidationError, match=message):
        encoders["idefics3"].encode(KEY, _generate("![](a)", images=[_png_header(side, side)]))


def test_an_image_the_processor_refuses(encoders: dict[str, Encoder]) -> None:
    """A 1-pixel strip Qwen2-VL's processor cannot resize is refused with the processor's reason."""
    strip = _file(Image.new("RGB", (300, 1)), "PNG")
    with pytest.raises(ValidationError, match=r"image 1 \(300x1 pixels\) cannot be processed .*aspect ratio"):
        encoders["qwen2_vl"].encode(KEY, _generate("![](a)", images=[strip]))


def test_too_much_pixel_data_is_refused(encoders: dict[str, Encoder], monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors over the per-request budget (96 MiB: a frame stops at 128) ask for fewer or smaller images."""
    monkeypatch.setattr(vision_processor, "MAX_TENSOR_BYTES", 40_000)
    with pytest.raises(ValidationError, match="send fewer or smaller images"):
        encoders["idefics3"].encode(KEY, _generate("![](a)![](b)", images=PICTURES))


@pytest.mark.parametrize("family", FAMILIES)
def test_placeholders_must_match_the_images(family: str, encoders: dict[str, Encoder]) -> None:
    """Markdown images without files, or the image token typed as text, are refused."""
    encoder = encoders[family]
    with pytest.raises(ValidationError, match="`inputs` has 2 markdown images but the request carries 1"):
        encoder.encode(KEY, _generate("![](a)![](b)", images=[PICTURES[0]]))
    with pytest.raises(ValidationError, match="the prompt has 1 image placeholders .* for 0 images"):
        encoder.encode(KEY, _generate(f"say {IMAGE_STRINGS[family]}"))
    with pytest.raises(ValidationError, match="the prompt has 2 image placeholders .* for 1 images"):
        encoder.encode(KEY, _generate(f"![](a) {IMAGE_STRINGS[family]}", images=[PICTURES[0]]))


def test_text_and_unsupported_vision_models_load_no_processor(tokenizer: PreTrainedTokenizerBase, tmp_path: Any,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A text model has no image side; a vision family ztgi does not serve is text only, with a warning."""
    assert load_vision_processor(tokenizer.name_or_path, tokenizer) is None
    (tmp_path / "config.json").write_text('{"model_type": "llava", "vision_config": {}}')
    assert load_vision_processor(str(tmp_path), tokenizer) is None
    assert ("llava vision-language model: images are supported for idefics3, smolvlm, qwen2_vl, qwen2_5_vl only"
            in caplog.text)


def test_a_text_model_refuses_images(tokenizer: PreTrainedTokenizerBase) -> None:
    """Images sent to a model without a vision encoder are the client's error, naming the model."""
    encoder = Encoder(tokenizer, ParameterLimits(), b"tokenizer-test", model_name="smollm2")
    with pytest.raises(ValidationError, match="this model does not take images: smollm2"):
        encoder.encode(KEY, _generate(messages=_chat([PICTURES[0]])))
    with pytest.raises(ValidationError, match="this model does not take images: smollm2"):
        encoder.encode(KEY, _generate("![](a)", images=[PICTURES[0]]))
    assert encoder.encode(KEY, _generate("![](a) stays text")).images == []
