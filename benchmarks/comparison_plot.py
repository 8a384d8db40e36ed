"""A PNG of a comparison: output tokens/s and TTFT against concurrency, static batching as a line.

matplotlib is a dev extra, imported only here and only when a plot is asked for.
"""

from __future__ import annotations

import logging
from typing import Any

from ztgi.bench.comparison import Comparison

CURVES = (("engine", "engine alone"), ("ztgi", "ztgi over HTTP"), ("padded", "ztgi, --kv-cache padded"))


def write_plot(path: str, comparison: Comparison) -> None:
    import matplotlib
    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    from matplotlib import pyplot

    figure, (throughput_axis, ttft_axis) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    _panel(throughput_axis, comparison, "output_token_throughput", 1.0, "output throughput (tok/s)")
    _panel(ttft_axis, comparison, "ttft_p50_s", 1000.0, "TTFT p50 (ms)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _scaled(figures: dict[str, float | None] | None, name: str, scale: float) -> float | None:
    """One figure of a level's medians, scaled; None when the level or the figure is missing."""
    value = None if figures is None else figures[name]
    return None if value is None else value * scale


def _panel(axis: Any, comparison: Comparison, figure_name: str, scale: float, title: str) -> None:
    levels = comparison.levels()
    for system, label in CURVES:
        scaled = ((level, _scaled(comparison.median(system, level), figure_name, scale))
                  for s, level in levels if s == system)
        points = [(level, value) for level, value in scaled if value is not None]
        if points:
            axis.plot(*zip(*points), marker="o", label=label)
    static = _scaled(comparison.median("static", comparison.static_batch_size), figure_name, scale)
    if static is not None:
        axis.axhline(static, linestyle="--", color="gray",
                     label=f"static batching (batch {comparison.static_batch_size})")
    axis.set_xscale("log", base=2)
    ticks = sorted({level for _, level in levels})
    axis.set_xticks(ticks, [str(t) for t in ticks])
    axis.set_xlabel("concurrency")
    axis.set_title(f"{title} vs concurrency")
    axis.legend(fontsize="small")
