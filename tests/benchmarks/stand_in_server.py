"""A stand-in HTTP server for the bench's component test: streams the three APIs at a fixed cadence.

It plays the bench's neighbour (a real server is tested end to end elsewhere): each request
waits `ttft_s`, then sends `max_new_tokens` token events `itl_s` apart. A prompt containing
`FAIL` gets an error event after its first token; one containing `REJECT` gets an HTTP 422.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web


class StandInServer:
    """An aiohttp server on a loopback port, in its own thread; `with` starts and stops it."""

    def __init__(self, ttft_s: float, itl_s: float) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.bodies: list[dict[str, Any]] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def resident_bytes(self) -> int:
        """It serves from the test's own process: that process's resident memory."""
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> StandInServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/generate_stream", self._tgi)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def _tgi(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        max_new_tokens = body["parameters"]["max_new_tokens"]

        def event(index: int, last: bool) -> dict[str, Any]:
            return {"index": index, "token": {"id": index, "text": f" t{index}", "logprob": 0.0, "special": False},
                    "generated_text": "done" if last else None, "details": None}
        return await self._stream(request, body, body["inputs"], max_new_tokens, event, None)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()

        def event(index: int, last: bool) -> dict[str, Any]:
            return {"object": "text_completion", "choices": [
                {"index": 0, "text": f" t{index}", "finish_reason": "length" if last else None}]}
        return await self._stream(request, body, body["prompt"], body["max_tokens"], event, "[DONE]")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()

        def event(index: int, last: bool) -> dict[str, Any]:
            return {"object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": f" t{index}"},
                 "finish_reason": "length" if last else None}]}
        prompt = body["messages"][-1]["content"]
        return await self._stream(request, body, prompt, body["max_tokens"], event, "[DONE]")

    async def _stream(self, request: web.Request, body: dict[str, Any], prompt: str, num_tokens: int,
                      event: Callable[[int, bool], dict[str, Any]], done: str | None) -> web.StreamResponse:
        self.bodies.append(body)
        if "REJECT" in prompt:
            raise web.HTTPUnprocessableEntity(text=json.dumps({"error": "rejected", "error_type": "validation"}),
                                              content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(self.ttft_s)
        for index in range(num_tokens):
            if index:
                await asyncio.sleep(self.itl_s)
            await response.write(_sse(event(index, index == num_tokens - 1)))
            if "FAIL" in prompt:
                await response.write(_sse({"error": "worker lost", "error_type": "generation"}))
                break
        if done is not None:
            await response.write(f"data: {done}\n\n".encode())
        await response.write_eof()
        return response


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()
