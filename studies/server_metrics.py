"""A launched server's scheduler figures, read over HTTP: `/metrics` samples and `/info`."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as {sample name: value}; labelled samples are summed over their labels."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url.rstrip("/") + "/metrics") as response:
        response.raise_for_status()
        return parse_metrics(await response.text())


async def server_info(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url.rstrip("/") + "/info") as response:
        response.raise_for_status()
        return await response.json()


def counter(values: dict[str, float], name: str) -> float:
    """A counter under either of its sample names (`name` or `name_total`), 0 when absent."""
    return values.get(name + "_total", values.get(name, 0.0))


@dataclasses.dataclass
class RunningSampler:
    """Polls `/metrics` every `interval_s` and keeps the scheduler's running-request count.

    `ztgi_requests_running` is what the scheduler's batches hold at the scrape: requests
    admitted (blocks or padded tokens granted) and not finished; waiting ones are in
    `tgi_queue_size`. Samples taken while nothing ran and nothing waited (before the first
    request, after the last) are left out of the median.
    """

    url: str
    interval_s: float = 0.1
    running: list[float] = dataclasses.field(default_factory=list)
    queued: list[float] = dataclasses.field(default_factory=list)

    async def run(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            values = await scrape(session, self.url)
            running, queued = values.get("ztgi_requests_running", 0.0), values.get("tgi_queue_size", 0.0)
            if running or queued:
                self.running.append(running)
                self.queued.append(queued)
            await asyncio.sleep(max(0.0, self.interval_s - (time.perf_counter() - started)))

    def figures(self) -> dict[str, float | int | None]:
        return {"samples": len(self.running), "max_running": max(self.running, default=None),
                "median_running": statistics.median(self.running) if self.running else None,
                "max_queued": max(self.queued, default=None)}
