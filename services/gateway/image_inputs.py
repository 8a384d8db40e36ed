"""Images in requests, before any socket: where each image is, its URL checked, data: URLs decoded.

Clients give an image as a URL: OpenAI's `image_url` content parts, TGI's markdown `![](url)` in
`inputs`. A `data:image/...;base64,` URL is decoded here; an http(s) URL is fetched by
`media_fetch` only when its host is in --allowed-media-domains (vLLM's guard against SSRF: the
gateway must not become a way into the network it sits in). Any other scheme is refused.

Between parsing and fetching, a chat turn's image part holds its URL in `text` and no bytes yet
(`pending_image`); `with_images` puts the files in their place, in order, and empties `text`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses

import yarl

from ztgi.common.codec import MAX_IMAGE_BYTES_PER_MESSAGE
from ztgi.common.messages import ChatMessage, ContentPart
from ztgi.common.parameters import ValidationError

IMAGE_MEDIA_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif")
"""What a data: URL may carry (image/jpg is a common misspelling of image/jpeg)."""
FETCHED_SCHEMES = ("http", "https")
_DATA_PREFIX = "data:"
_URL_SHOWN_CHARS = 60  # a data URL in an error message is cut: it can be megabytes long


def pending_image(url: str) -> ContentPart:
    """An image part whose file is still to be loaded from `url`."""
    return ContentPart("image", text=url)


def pending_urls(messages: list[ChatMessage]) -> list[str]:
    """The URL of every image part still to load, over all turns, in order."""
    return [part.text for message in messages for part in message.parts or () if part.type == "image"
            and not part.image]


def with_images(messages: list[ChatMessage], images: list[bytes]) -> list[ChatMessage]:
    """The turns with each pending image part replaced by its file, in the order of `pending_urls`."""
    files = iter(images)
    resolved = []
    for message in messages:
        if message.parts is not None:
            parts = [ContentPart("image", image=next(files)) if part.type == "image" and not part.image else part
                     for part in message.parts]
            message = dataclasses.replace(message, parts=parts)
        resolved.append(message)
    assert next(files, None) is None, "one file per pending image"
    return resolved


def check_num_images(num_images: int, max_images: int, field: str) -> None:
    """Before anything is fetched: at most --max-images-per-request images in one request."""
    if num_images > max_images:
        raise ValidationError(field, f"the request has {num_images} images, more than --max-images-per-request "
                                     f"{max_images}")


def check_total_bytes(files: list[bytes], field: str) -> None:
    """A request's files must fit, together, in the message that takes them to the scheduler."""
    total = sum(len(data) for data in files)
    if total > MAX_IMAGE_BYTES_PER_MESSAGE:
        raise ValidationError(field, f"the request's {len(files)} images take {total} bytes, more than the "
                                     f"{MAX_IMAGE_BYTES_PER_MESSAGE} one request may carry: send fewer or smaller "
                                     f"images")


def is_data_url(url: str) -> bool:
    return url[:len(_DATA_PREFIX)].lower() == _DATA_PREFIX


def decode_data_url(url: str, max_image_bytes: int, field: str) -> bytes:
    """The file in `data:image/png;base64,...`; ValidationError for another media type, an
    encoding other than base64, bad base64, an empty file or one over --max-image-bytes."""
    header, comma, payload = url[len(_DATA_PREFIX):].partition(",")
    payload = "".join(payload.split())  # some encoders wrap base64 in lines (MIME's 76 columns)
    media_type, *params = header.split(";")
    if not comma or "base64" not in (param.strip().lower() for param in params):
        raise ValidationError(field, f"a data URL must be `data:<image type>;base64,<data>`. Given: {shown(url)}")
    media_type = media_type.strip().lower()
    if media_type not in IMAGE_MEDIA_TYPES:
        raise ValidationError(field, f"the data URL's media type `{media_type}` is not an image this server "
                                     f"reads (image/png, image/jpeg, image/webp or image/gif)")
    if len(payload) // 4 * 3 > max_image_bytes + 2:  # before decoding: the size base64 implies
        raise _too_large(len(payload) // 4 * 3, max_image_bytes, field)
    try:
        image = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(field, f"the data URL's payload is not valid base64. Given: {shown(url)}") from None
    if not image:
        raise ValidationError(field, f"the data URL holds an empty image. Given: {shown(url)}")
    if len(image) > max_image_bytes:
        raise _too_large(len(image), max_image_bytes, field)
    return image


def fetched_url(url: str, allowed_domains: tuple[str, ...], field: str) -> yarl.URL:
    """`url` parsed, to fetch as it is: http(s), its host in --allowed-media-domains; ValidationError
    naming the scheme or the host otherwise (checked before any connection)."""
    try:
        parsed = yarl.URL(url)
    except ValueError:
        raise ValidationError(field, f"the image URL {shown(url)} is not a valid URL") from None
    if parsed.scheme.lower() not in FETCHED_SCHEMES or not parsed.host:
        raise ValidationError(field, f"the image URL {shown(url)} is neither a data: URL nor an http(s) URL "
                                     f"(send the image as data:image/png;base64,...)")
    if not host_allowed(parsed.host, allowed_domains):
        raise ValidationError(field, f"the image URL's host `{parsed.host}` is not in --allowed-media-domains "
                                     f"({', '.join(allowed_domains) or 'empty: this server fetches no URL'}); "
                                     f"send the image as a data: URL")
    return parsed


def host_allowed(host: str, allowed_domains: tuple[str, ...]) -> bool:
    """A host matches an allowed domain itself or as one of its subdomains (`a.example.com`
    under `example.com`; never `badexample.com`)."""
    host = host.lower().rstrip(".")
    return any(host == domain or host.endswith("." + domain) for domain in allowed_domains)


def shown(url: str) -> str:
    """`url` for an error message: quoted, cut after a few dozen characters."""
    return f"`{url[:_URL_SHOWN_CHARS]}...`" if len(url) > _URL_SHOWN_CHARS else f"`{url}`"


def _too_large(num_bytes: int, max_image_bytes: int, field: str) -> ValidationError:
    return ValidationError(field, f"an image of {num_bytes} bytes is larger than --max-image-bytes {max_image_bytes}")
