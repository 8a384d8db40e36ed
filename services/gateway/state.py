"""Typed keys for what the gateway keeps on its `web.Application`."""

from __future__ import annotations

import weakref

from aiohttp import web

from common.client import AsyncZtgiClient
from services.gateway.config import GatewayConfig

CONFIG = web.AppKey("config", GatewayConfig)
CLIENT = web.AppKey("client", AsyncZtgiClient)
STREAMS = web.AppKey("streams", weakref.WeakSet)
"""Open SSE streams (`EventStream`), ended with a reason when the gateway shuts down."""
