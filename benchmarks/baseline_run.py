"""One measured run of one system at one load level, with `ztgi bench`'s figures, and its JSON."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from ztgi.bench.load_generator import RunResult
from ztgi.bench.metrics import RequestRecord, Summary, summarize


@dataclasses.dataclass
class BaselineRun:
    """`system` (static, engine or ztgi) at `concurrency` (the batch size for static batching).

    `extra` holds figures only one system has, e.g. static batching's per-batch times.
    """

    system: str
    concurrency: int
    records: list[RequestRecord]
    summary: Summary
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_bench(cls, system: str, run: RunResult) -> BaselineRun:
        return cls(system, run.concurrency or 0, run.records, run.summary)

    def to_json(self, with_requests: bool = True) -> dict[str, Any]:
        result = {"system": self.system, "concurrency": self.concurrency, "summary": self.summary.to_json(),
                  **self.extra}
        if with_requests:
            result["requests"] = [r.to_json() for r in self.records]
        return result


def joined(parts: Sequence[BaselineRun]) -> BaselineRun:
    """Runs of one system at one level, one after the other, as one run: the records renumbered
    in order with their start times laid end to end, the durations added (`extra` is dropped)."""
    records: list[RequestRecord] = []
    offset_s = 0.0
    for part in parts:
        records += [dataclasses.replace(record, request_id=len(records) + index, start_s=record.start_s + offset_s)
                    for index, record in enumerate(part.records)]
        offset_s += part.summary.duration_s
    return BaselineRun(parts[0].system, parts[0].concurrency, records, summarize(records, offset_s))


def results_json(config: Any, runs: Sequence[BaselineRun], with_requests: bool = True) -> dict[str, Any]:
    """`{config, runs: [{system, concurrency, summary, ..., requests}]}`; times in seconds."""
    return {"config": dataclasses.asdict(config), "runs": [run.to_json(with_requests) for run in runs]}


def write_results(path: str, results: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as file:
        json.dump(results, file, indent=1)
        file.write("\n")
