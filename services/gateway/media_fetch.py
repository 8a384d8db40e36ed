"""The gateway's image loader: one request's image URLs to files, over one shared HTTP session.

Every URL is checked first (count, scheme, allowed host, data: URLs decoded), so a request with
one bad URL connects nowhere; then the http(s) ones are fetched together. A fetch follows no
redirect (a 3xx could lead off the allowed hosts), stops after --media-fetch-timeout-s and reads
at most --max-image-bytes. Every failure is a ValidationError naming the host and what went
wrong: the client sent a URL this server could not use.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import yarl

from ztgi.common.markdown_images import image_urls
from ztgi.common.messages import ChatMessage
from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.config import GatewayConfig
from ztgi.services.gateway.image_inputs import (
    check_num_images,
    check_total_bytes,
    decode_data_url,
    fetched_url,
    is_data_url,
    pending_urls,
    with_images,
)

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 64 * 1024


class MediaFetcher:
    """Loads the images of requests for one gateway (see the module docstring)."""

    def __init__(self, session: aiohttp.ClientSession, config: GatewayConfig) -> None:
        self.session = session
        self.allowed_domains = config.allowed_media_domain_list
        self.timeout_s = config.media_fetch_timeout_s
        self.max_image_bytes = config.max_image_bytes
        self.max_images = config.max_images_per_request

    async def resolve_messages(self, messages: list[ChatMessage], field: str = "messages") -> list[ChatMessage]:
        """The chat turns with each image part's file loaded (the same list when there is none)."""
        urls = pending_urls(messages)
        return with_images(messages, await self.load(urls, field)) if urls else messages

    async def inputs_images(self, inputs: str, field: str = "inputs") -> list[bytes] | None:
        """The files of TGI's markdown images in `inputs`, in order (None when there is none)."""
        urls = image_urls(inputs)
        return await self.load(urls, field) if urls else None

    async def load(self, urls: list[str], field: str) -> list[bytes]:
        """One file per URL, in order; ValidationError (`field`) for the first URL that fails, or
        files that together would not fit in one message to the scheduler."""
        check_num_images(len(urls), self.max_images, field)
        sources = [self._source(url, field) for url in urls]
        fetched = iter(await self._fetch_all([s for s in sources if isinstance(s, yarl.URL)], field))
        files = [next(fetched) if isinstance(source, yarl.URL) else source for source in sources]
        check_total_bytes(files, field)
        return files

    async def fetch(self, url: yarl.URL, field: str) -> bytes:
        """The body of a 2xx answer to GET `url`, within the time and size limits."""
        host = url.host
        try:
            async with self.session.get(url, allow_redirects=False,
                                        timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as response:
                if not 200 <= response.status < 300:
                    raise _fetch_error(field, host, f"HTTP {response.status} {response.reason or ''}".rstrip()
                                       + (" (redirects are not followed)" if 300 <= response.status < 400 else ""))
                return await self._body(response, host, field)
        except TimeoutError:
            raise _fetch_error(field, host, f"no answer within --media-fetch-timeout-s {self.timeout_s:g} s") from None
        except aiohttp.ClientConnectorError as exc:
            raise _fetch_error(field, host, f"cannot connect ({exc.os_error.strerror or exc.os_error})") from None
        except aiohttp.ClientError as exc:
            raise _fetch_error(field, host, f"{type(exc).__name__}: {exc}") from None

    def _source(self, url: str, field: str) -> bytes | yarl.URL:
        """A data: URL's file, or the checked URL to fetch."""
        if is_data_url(url):
            return decode_data_url(url, self.max_image_bytes, field)
        return fetched_url(url, self.allowed_domains, field)

    async def _fetch_all(self, urls: list[yarl.URL], field: str) -> list[bytes]:
        """Fetches together; the first failure cancels the rest and is raised alone."""
        if not urls:
            return []
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self.fetch(url, field)) for url in urls]
        except BaseExceptionGroup as failures:
            raise failures.exceptions[0] from None
        return [task.result() for task in tasks]

    async def _body(self, response: aiohttp.ClientResponse, host: str | None, field: str) -> bytes:
        too_large = f"the image is larger than --max-image-bytes {self.max_image_bytes}"
        if response.content_length is not None and response.content_length > self.max_image_bytes:
            raise _fetch_error(field, host, too_large)
        body = bytearray()
        async for chunk in response.content.iter_chunked(_CHUNK_BYTES):
            body += chunk
            if len(body) > self.max_image_bytes:
                raise _fetch_error(field, host, too_large)
        if not body:
            raise _fetch_error(field, host, "the answer is empty")
        logger.debug("fetched an image of %d bytes from %s", len(body), host)
        return bytes(body)


def _fetch_error(field: str, host: str | None, what: str) -> ValidationError:
    return ValidationError(field, f"fetching the image at host `{host}` failed: {what}")
