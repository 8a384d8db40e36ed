"""The gateway's aiohttp application: state keys, the client's lifetime, the route table."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import weakref
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.services.gateway import (
    anthropic_messages,
    api_docs,
    embeddings,
    handlers,
    lora_adapters,
    openai_handlers,
    responses_handlers,
)
from ztgi.services.gateway.auth import auth_middleware
from ztgi.services.gateway.config import GatewayConfig
from ztgi.services.gateway.cors import install_cors
from ztgi.services.gateway.errors import error_middleware
from ztgi.services.gateway.media_fetch import MediaFetcher
from ztgi.services.gateway.metrics import METRICS, GatewayMetrics, handle_metrics, rejection_middleware
from ztgi.services.gateway.reasoning_start import ReasoningStart
from ztgi.services.gateway.request_id import echo_request_id, request_id_middleware
from ztgi.services.gateway.responses_store import ResponseStore
from ztgi.services.gateway.served_model import ServedModel
from ztgi.services.gateway.sse import EventStream
from ztgi.services.gateway.state import (
    CLIENT,
    CONFIG,
    EXIT_STATUS,
    MEDIA_FETCHER,
    REASONING_START,
    RESPONSE_STORE,
    SERVED_MODEL,
    STREAMS,
    ExitStatus,
)

logger = logging.getLogger(__name__)

SHUTDOWN_REASON = "the gateway is shutting down"
HANDSHAKE_CHECK_S = 0.5


def make_app(config: GatewayConfig) -> web.Application:
    """The TGI HTTP API over one `AsyncZtgiClient` connected to the scheduler."""
    app = web.Application(middlewares=[error_middleware, request_id_middleware, auth_middleware,
                                       rejection_middleware],
                          client_max_size=config.max_payload_bytes)
    app.on_response_prepare.append(echo_request_id)
    install_cors(app, config.cors_allow_origins)
    app[CONFIG] = config
    app[STREAMS] = weakref.WeakSet()
    app[METRICS] = GatewayMetrics()
    app[EXIT_STATUS] = ExitStatus()
    app[RESPONSE_STORE] = ResponseStore()
    app.cleanup_ctx.append(_client_context)
    app.cleanup_ctx.append(_media_context)
    app.on_shutdown.append(_drain_streams)
    app.add_routes([
        web.post("/", handlers.compat_generate),
        web.post("/generate", handlers.generate),
        web.post("/generate_stream", handlers.generate_stream),
        web.post("/invocations", handlers.invocations),
        web.get("/health", handlers.health),
        web.get("/info", handlers.info),
        web.get("/ping", handlers.ping),
        web.post("/tokenize", handlers.tokenize),
        web.post("/detokenize", handlers.detokenize),
        web.get("/metrics", handle_metrics),
        web.post("/v1/chat/completions", openai_handlers.chat_completions),
        web.post("/v1/completions", openai_handlers.completions),
        web.post("/v1/responses", responses_handlers.create_response),
        web.get("/v1/responses/{response_id}", responses_handlers.retrieve_response),
        web.delete("/v1/responses/{response_id}", responses_handlers.delete_response),
        web.post("/v1/embeddings", embeddings.embeddings),
        web.get("/v1/models", openai_handlers.models),
        web.get("/v1/models/{model_id:.+}", openai_handlers.model),
        web.post("/v1/load_lora_adapter", lora_adapters.load_lora_adapter),
        web.post("/v1/unload_lora_adapter", lora_adapters.unload_lora_adapter),
        web.post("/v1/messages", anthropic_messages.messages),
        web.post("/v1/messages/count_tokens", anthropic_messages.count_tokens),
        web.get("/docs", api_docs.docs),
        web.get("/api-doc/openapi.json", api_docs.openapi_json),
    ])
    return app


async def _client_context(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    client = AsyncZtgiClient(
        config.scheduler_url, heartbeat_interval_ms=config.heartbeat_interval_ms,
        heartbeat_misses=config.heartbeat_misses, query_timeout_s=config.query_timeout_s,
        request_timeout_s=config.request_timeout_s, curve_keys=config.curve_keys,
        handshake_timeout_s=config.handshake_timeout_s)
    client.observe = app[METRICS].observe
    app[CLIENT] = await client.start()
    app[SERVED_MODEL] = ServedModel(client)
    if config.reasoning_parser is not None:
        app[REASONING_START] = ReasoningStart(client)
    watcher = asyncio.create_task(_give_up_on_a_failing_handshake(app))
    yield
    watcher.cancel()
    await client.aclose()


async def _media_context(app: web.Application) -> AsyncIterator[None]:
    """One HTTP client session for every image fetch: its connection pool is shared, and closed
    with the gateway. It keeps no cookies (one client's fetch must not carry another's) and reads
    no proxy settings from the environment."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        app[MEDIA_FETCHER] = MediaFetcher(session, app[CONFIG])
        yield


async def _give_up_on_a_failing_handshake(app: web.Application) -> None:
    """A gateway whose handshake with the scheduler keeps failing (CURVE keys) serves nothing:
    after `handshake_timeout_s` it stops itself with exit code 1, as a worker or tokenizer does."""
    client = app[CLIENT]
    while not client.handshake.expired:
        await asyncio.sleep(HANDSHAKE_CHECK_S)
    logger.error("no handshake with the scheduler for %g s (%s): exiting", app[CONFIG].handshake_timeout_s,
                 client.handshake.failure)
    app[EXIT_STATUS].code = 1
    signal.raise_signal(signal.SIGTERM)  # run_app's own handler: a clean stop


async def _drain_streams(app: web.Application) -> None:
    """Lets open streams finish for `shutdown_timeout_s`, then ends the rest with a reason."""
    streams: weakref.WeakSet[EventStream] = app[STREAMS]
    deadline = time.monotonic() + app[CONFIG].shutdown_timeout_s
    if streams:
        logger.info("draining %d open streams", len(streams))
    while streams and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    tasks = [stream.abort(SHUTDOWN_REASON, "unhealthy") for stream in list(streams)]
    if tasks:
        await asyncio.wait(tasks, timeout=1.0)  # let each write its last event before the server closes
