"""Typed keys for what the gateway keeps on its `web.Application`."""

from __future__ import annotations

import weakref

from aiohttp import web

from common.client import AsyncZtgiClient
from services.gateway.config import GatewayConfig
from services.gateway.served_model import ServedModel

CONFIG = web.AppKey("config", GatewayConfig)
CLIENT = web.AppKey("client", AsyncZtgiClient)
SERVED_MODEL = web.AppKey("served_model", ServedModel)
STREAMS = web.AppKey("streams", weakref.WeakSet)
"""Open SSE streams (`EventStream`), ended with a reason when the gateway shuts down."""
