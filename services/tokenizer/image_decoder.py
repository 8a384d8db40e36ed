"""An image file a client sent, decoded into the RGB picture an image processor takes, or refused.

The file comes from the network: it is checked before its pixels are decoded (format, pixel
count) and every decoding failure is the client's `ValidationError`, never the service's crash.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, ImageOps

from ztgi.common.parameters import ValidationError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
FORMAT_NAMES = "PNG, JPEG, WebP or GIF"


def decode_image(data: bytes, number: int, max_pixels: int) -> Image.Image:
    """Image `number` (1-based, for the message) as RGB: the first frame of an animation, turned
    upright by its EXIF orientation as transformers' `load_image` does."""
    image = _open(data, number)
    width, height = image.size
    if width * height > max_pixels:  # checked on the header, before a pixel is decoded
        raise ValidationError("images", f"image {number} has {width}x{height} = {width * height} pixels, more than "
                                        f"the {max_pixels} this server takes (--max-image-pixels)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PIL warns about palettes with transparency, and EXIF quirks
            image.load()
            return ImageOps.exif_transpose(image).convert("RGB")
    except Exception as exc:  # PIL raises OSError, ValueError, SyntaxError... for a damaged file
        raise ValidationError("images", f"image {number} is corrupt or truncated: {exc}") from None


def _open(data: bytes, number: int) -> Image.Image:
    """The file's header read with only the formats we take; the pixel check is ours, not PIL's
    warning (so PIL's own limit stays as a backstop, at twice its default)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as exc:
        raise ValidationError("images", f"image {number} has too many pixels: {exc}") from None
    except Exception:
        raise ValidationError("images", f"image {number} {_what_instead(data)}: send a {FORMAT_NAMES} file") from None


def _what_instead(data: bytes) -> str:
    """Why the file was refused: another format PIL knows (named), or no image at all."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = Image.open(io.BytesIO(data)).format
    except Exception:
        return "is not a readable image file (corrupt, or not an image)"
    return f"is a {found} file, a format this server does not take"
