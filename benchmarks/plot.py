"""A PNG of the results: latency histograms for one run, figures against concurrency for a sweep.

matplotlib is a dev extra, imported only here and only when a plot is asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ztgi.bench.load_generator import RunResult
from ztgi.bench.report import LATENCIES, load_label


def write_plot(path: str, runs: Sequence[RunResult]) -> None:
    """Writes the PNG: histograms for a single run, curves when several levels were run."""
    import matplotlib
    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    from matplotlib import pyplot

    if len(runs) > 1 and all(run.concurrency for run in runs):
        figure = _sweep_figure(pyplot, runs)
    else:
        figure = _histogram_figure(pyplot, runs)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _histogram_figure(pyplot: Any, runs: Sequence[RunResult]) -> Any:
    figure, axes = pyplot.subplots(2, 2, figsize=(11, 7))
    for axis, (name, field) in zip(axes.flat, LATENCIES):
        for run in runs:
            values = [v * 1000 for v in _samples(run, field)]
            if values:
                axis.hist(values, bins=40, alpha=0.6, label=load_label(run))
        axis.set_title(f"{name} distribution")
        axis.set_xlabel("ms")
        axis.set_ylabel("count")
        if axis.has_data():
            axis.legend(fontsize="small")
    return figure


def _samples(run: RunResult, field: str) -> list[float]:
    successes = [r for r in run.records if r.success]
    if field == "itl_s":
        return [gap for r in successes for gap in r.itl_s]
    return [value for r in successes if (value := getattr(r, field)) is not None]


def _sweep_figure(pyplot: Any, runs: Sequence[RunResult]) -> Any:
    figure, axes = pyplot.subplots(3, 2, figsize=(11, 11))
    levels = [run.concurrency for run in runs]
    _curve(axes[0][0], levels, "output throughput (tok/s)",
           {"tok/s": [run.summary.output_token_throughput for run in runs]})
    _curve(axes[0][1], levels, "request throughput (req/s)",
           {"req/s": [run.summary.request_throughput for run in runs]})
    for axis, (name, field) in zip(list(axes[1]) + list(axes[2]), LATENCIES):
        series = {q: [_ms(getattr(getattr(run.summary, field), q)) for run in runs] for q in ("p50", "p90", "p99")}
        _curve(axis, levels, f"{name} (ms)", series)
    return figure


def _curve(axis: Any, levels: list[int | None], title: str, series: dict[str, list[float | None]]) -> None:
    for label, values in series.items():
        axis.plot(levels, [float("nan") if v is None else v for v in values], marker="o", label=label)
    axis.set_xscale("log", base=2)
    axis.set_xticks(levels, [str(level) for level in levels])
    axis.set_title(f"{title} vs concurrency")
    axis.set_xlabel("concurrency")
    axis.legend(fontsize="small")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
