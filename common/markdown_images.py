"""TGI's images in a raw prompt: markdown `![alt](url)`, found the same way by the gateway (which
fetches or decodes each url) and the tokenizer (which puts the model's image tokens in its place)."""

from __future__ import annotations

import re

MARKDOWN_IMAGE = re.compile(r"!\[[^\]\n]*\]\(([^)\s]+)\)")


def image_urls(text: str) -> list[str]:
    """The url of each markdown image in `text`, in order."""
    return [match.group(1) for match in MARKDOWN_IMAGE.finditer(text)]


def split_at_images(text: str) -> list[str]:
    """The text around the markdown images: one more piece than there are images."""
    return MARKDOWN_IMAGE.split(text)[::2]
