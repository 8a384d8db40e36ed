"""The load generator: sends the workload at one load level and collects a record per request."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import random
import time
from collections.abc import Iterator

import aiohttp
from tqdm import tqdm

from ztgi.bench.client import send_request
from ztgi.bench.config import BenchConfig
from ztgi.bench.http_backends import make_backend
from ztgi.bench.metrics import RequestRecord, Summary, summarize
from ztgi.bench.workload import Prompt

logger = logging.getLogger(__name__)

READ_BUFFER_BYTES = 1 << 20  # a final event repeats the whole text: lines may be long
KEEPALIVE_S = 300.0  # a session reused across load levels keeps its connections between them


@dataclasses.dataclass
class RunResult:
    """One load level: how it was driven, every request, and the figures."""

    concurrency: int | None
    request_rate: float | None
    records: list[RequestRecord]
    summary: Summary

    def to_json(self) -> dict:
        return {"concurrency": self.concurrency, "request_rate": self.request_rate,
                "summary": self.summary.to_json(), "requests": [r.to_json() for r in self.records]}


def http_session(request_timeout_s: float | None) -> aiohttp.ClientSession:
    """A session for `LoadGenerator.run_in`; its idle connections stay open for `KEEPALIVE_S`."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=READ_BUFFER_BYTES)


class LoadGenerator:
    """Sends the prompts in turn, cycling, until `num_requests` or `duration_s` runs out.

    Closed loop: at most `concurrency` requests in flight, the next one sent as soon as one
    finishes. Open loop: requests arrive as a seeded Poisson process of `request_rate` per
    second (and still wait for a free slot when `concurrency` is set too). When the duration
    is over, no new request starts; those in flight finish and count.
    """

    def __init__(self, config: BenchConfig, prompts: list[Prompt]) -> None:
        self.config = config
        self.prompts = prompts
        self.backend = make_backend(config)
        self.num_requests = config.num_requests or (None if config.duration_s else len(prompts))
        names = [name.strip() for name in (config.lora_adapters or "").split(",") if name.strip()]
        self.adapters: list[str | None] = [None if name == "base" else name for name in names]

    async def run(self, concurrency: int | None) -> RunResult:
        """Runs one load level in a session of its own."""
        async with http_session(self.config.request_timeout_s) as session:
            return await self.run_in(session, concurrency)

    async def run_in(self, session: aiohttp.ClientSession, concurrency: int | None) -> RunResult:
        """Runs one load level over `session` and summarizes it (duration: first send to last answer)."""
        logger.info("running %s requests against %s%s, concurrency %s, request rate %s",
                    self.num_requests or "unbounded", self.config.url, self.backend.path,
                    concurrency or "unbounded", self.config.request_rate or "unbounded")
        start = time.perf_counter()
        records = await self._send_all(session, concurrency, start)
        duration_s = time.perf_counter() - start
        return RunResult(concurrency, self.config.request_rate, records, summarize(records, duration_s))

    async def _send_all(self, session: aiohttp.ClientSession, concurrency: int | None,
                        start: float) -> list[RequestRecord]:
        deadline = start + (self.config.duration_s or math.inf)
        slots = asyncio.Semaphore(concurrency) if concurrency else None
        records: list[RequestRecord] = []
        tasks: list[asyncio.Task] = []
        request_ids = range(self.num_requests) if self.num_requests else itertools.count()
        with tqdm(total=self.num_requests, unit="req", disable=None if self.config.progress else True) as bar:
            for request_id, arrival_s in zip(request_ids, self._arrival_times()):
                if start + arrival_s >= deadline:
                    break
                await asyncio.sleep(max(0.0, start + arrival_s - time.perf_counter()))
                if slots is not None:
                    await slots.acquire()
                if time.perf_counter() >= deadline:
                    break
                record = self._record(request_id, time.perf_counter() - start)
                records.append(record)
                tasks.append(asyncio.create_task(self._send(session, record, slots, bar)))
            await asyncio.gather(*tasks)
        return records

    def _arrival_times(self) -> Iterator[float]:
        """Seconds since the start at which each request may go: 0 for all, or Poisson."""
        rate = self.config.request_rate
        if rate is None:
            yield from itertools.repeat(0.0)
            return
        rng = random.Random(self.config.seed)
        arrival_s = 0.0
        while True:
            yield arrival_s
            arrival_s += rng.expovariate(rate)

    def _record(self, request_id: int, start_s: float) -> RequestRecord:
        prompt = self.prompts[request_id % len(self.prompts)]
        return RequestRecord(request_id=request_id, max_new_tokens=prompt.max_new_tokens,
                             input_tokens=prompt.input_tokens, start_s=start_s)

    async def _send(self, session: aiohttp.ClientSession, record: RequestRecord,
                    slots: asyncio.Semaphore | None, bar: tqdm) -> None:
        try:
            prompt = self.prompts[record.request_id % len(self.prompts)]
            if self.adapters:
                prompt = dataclasses.replace(prompt, adapter=self.adapters[record.request_id % len(self.adapters)])
            await send_request(session, self.config.url.rstrip("/"), self.backend, prompt, record)
            if record.error is not None:
                logger.debug("request %d failed: %s", record.request_id, record.error)
        finally:
            if slots is not None:
                slots.release()
            bar.update(1)
