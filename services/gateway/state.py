"""Typed keys for what the gateway keeps on its `web.Application`."""

from __future__ import annotations

import dataclasses
import weakref

from aiohttp import web

from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.services.gateway.config import GatewayConfig
from ztgi.services.gateway.media_fetch import MediaFetcher
from ztgi.services.gateway.reasoning_start import ReasoningStart
from ztgi.services.gateway.responses_store import ResponseStore
from ztgi.services.gateway.served_model import ServedModel


@dataclasses.dataclass
class ExitStatus:
    """The gateway process's exit code, set before it stops itself (1: it could not do its job)."""

    code: int = 0


CONFIG = web.AppKey("config", GatewayConfig)
CLIENT = web.AppKey("client", AsyncZtgiClient)
SERVED_MODEL = web.AppKey("served_model", ServedModel)
REASONING_START = web.AppKey("reasoning_start", ReasoningStart)
"""Set with `--reasoning-parser` only: whether answers start inside the reasoning."""
STREAMS = web.AppKey("streams", weakref.WeakSet)
"""Open SSE streams (`EventStream`), ended with a reason when the gateway shuts down."""
EXIT_STATUS = web.AppKey("exit_status", ExitStatus)
RESPONSE_STORE = web.AppKey("response_store", ResponseStore)
"""Responses created with `store: true`, for `previous_response_id` (this gateway's memory only)."""
MEDIA_FETCHER = web.AppKey("media_fetcher", MediaFetcher)
"""Loads requests' images (data: URLs, and http(s) URLs of --allowed-media-domains) over one HTTP session."""
REQUEST_ID = "request_id"
"""Where a `web.Request` keeps its id (`request_id.request_id_middleware`)."""
