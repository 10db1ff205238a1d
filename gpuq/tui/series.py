"""Chart series from runner metrics samples, for the job detail view.

Samples are the dicts of `gpuq.control.sample_to_dict` (fields of
`gpuq.control.MetricsSample`), as the `metrics` request, the `metrics` key of
`show` and the `metrics` subscription topic carry them. Pure code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpuq.units import format_size

Sample = Mapping[str, Any]
MAX_POINTS: Final = 600
"""Samples kept per job for the charts (the oldest are dropped)."""


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _rate(value: float) -> str:
    return f"{value:,.1f}/s"


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _bytes(value: float) -> str:
    return format_size(int(value))


@dataclass(frozen=True, slots=True)
class ChartSpec:
    """One chart: its title, the sample field it plots and how values read."""

    key: str
    title: str
    field: str
    fmt: Callable[[float], str]


CHARTS: Final = (
    ChartSpec("step", "step time", "step_seconds", _seconds),
    ChartSpec("throughput", "throughput (samples/s)", "samples_per_second", _rate),
    ChartSpec("batch", "batch size", "batch_size", _count),
    ChartSpec("goodput", "goodput", "goodput", _rate),
    ChartSpec("memory_min", "memory minimum", "memory_min_bytes", _bytes),
    ChartSpec("memory_peak", "memory peak", "memory_peak_bytes", _bytes),
)
"""The detail view's charts, in display order."""


@dataclass(frozen=True, slots=True)
class Series:
    """The points of one chart and a caption with its latest value."""

    spec: ChartSpec
    values: tuple[float, ...]

    @property
    def caption(self) -> str:
        """`step time  123 ms (min 98 ms, max 140 ms)`, or `step time  -` when empty."""
        if not self.values:
            return f"{self.spec.title}  -"
        fmt = self.spec.fmt
        low, high = min(self.values), max(self.values)
        return f"{self.spec.title}  {fmt(self.values[-1])}  (min {fmt(low)}, max {fmt(high)})"


def build_series(samples: Sequence[Sample]) -> list[Series]:
    """One series per chart from samples oldest first; missing values are skipped."""
    out = []
    for spec in CHARTS:
        values = tuple(
            float(sample[spec.field])
            for sample in samples
            if isinstance(sample.get(spec.field), int | float)
        )
        out.append(Series(spec, values))
    return out


def merge_samples(old: Sequence[Sample], new: Iterable[Sample]) -> list[Sample]:
    """Append samples newer than the last one held, keeping at most `MAX_POINTS`."""
    merged = list(old)
    last = merged[-1]["time"] if merged else float("-inf")
    for sample in new:
        if sample["time"] > last:
            merged.append(sample)
            last = sample["time"]
    return merged[-MAX_POINTS:]


BAR_EIGHTHS: Final = " ▁▂▃▄▅▆▇█"


def plot_rows(values: Sequence[float], width: int, height: int) -> list[str]:
    """A bar chart of the last `width` values, `height` rows tall, zoomed to their range.

    Each column is one value; eighth blocks give each row eight levels, so a
    3-row chart tells 24 heights apart. Fewer values than columns leave the
    left side blank, as a chart that fills up from the right.
    """
    if width <= 0 or height <= 0:
        return []
    recent = list(values)[-width:]
    top = max(recent, default=0.0)
    low = min(recent, default=0.0)
    # Zoom in on the range the values move in, keeping a fifth of it below the lowest
    # bar so the minimum still shows; values that never change fill half the height.
    base = max(0.0, low - (top - low) * 0.25) if top > low else max(0.0, top / 2)
    span = top - base
    levels = [
        0 if span <= 0 else max(1, round((max(base, v) - base) / span * height * 8)) for v in recent
    ]
    levels = [0] * (width - len(levels)) + levels
    rows = []
    for row in range(height):
        floor = (height - 1 - row) * 8
        rows.append("".join(BAR_EIGHTHS[min(8, max(0, level - floor))] for level in levels))
    return rows
