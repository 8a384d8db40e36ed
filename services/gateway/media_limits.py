"""The gateway's settings for images in requests, shared with `ztgi launch` (which passes them on).

An image URL is fetched only from hosts listed in --allowed-media-domains: by default none, so the
gateway opens no connection a client chose (vLLM's guard against SSRF); data: URLs need no fetch.
"""

from __future__ import annotations

import dataclasses

from ztgi.common.config import require


@dataclasses.dataclass(frozen=True)
class MediaLimits:
    """Where images may come from and how large they may be (a mixin of the gateway's and launcher's configs)."""

    allowed_media_domains: str = dataclasses.field(default="", metadata={
        "help": "comma-separated hosts whose http(s) image URLs the gateway fetches (a host matches itself "
                "and its subdomains); empty: no URL is fetched, images come as data: URLs (guards against SSRF)"})
    media_fetch_timeout_s: float = dataclasses.field(default=10.0, metadata={
        "help": "how long fetching one image URL may take, body included"})
    max_image_bytes: int = dataclasses.field(default=20 * 1024 * 1024, metadata={
        "help": "bytes of one image, fetched or in a data: URL; a larger one is refused"})
    max_images_per_request: int = dataclasses.field(default=8, metadata={
        "help": "images in one request, over all its chat turns or its whole prompt"})

    def check_media(self) -> None:
        """Called by each config's `__post_init__` (a mixin's own would not run in the chain)."""
        require(self.media_fetch_timeout_s > 0, "--media-fetch-timeout-s must be positive")
        require(self.max_image_bytes > 0, "--max-image-bytes must be positive")
        require(self.max_images_per_request >= 0, "--max-images-per-request must be >= 0 (0: no images)")
        for domain in self.allowed_media_domain_list:
            require(all(c.isalnum() or c in ".-" for c in domain) and domain.strip(".") == domain,
                    f"--allowed-media-domains: {domain!r} is not a host name (give hosts such as "
                    f"example.com or 127.0.0.1, no scheme, port or path)")

    @property
    def allowed_media_domain_list(self) -> tuple[str, ...]:
        """The hosts of --allowed-media-domains, lower case."""
        return tuple(domain.strip().lower() for domain in self.allowed_media_domains.split(",") if domain.strip())
