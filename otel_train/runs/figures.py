"""What the report plots, computed from a run record (record_data.py).

Time runs in bins of the record's metric interval from the run's first snapshot. Each
rank's cumulative histograms become deltas over the intervals between its step
histogram's samples (intervals.py: a phase histogram sampled a moment before or after
the step histogram of its export lands in the step's bin); the ranks are then combined
per bin: step and phase times summed (their quantiles from the summed histograms),
throughput (the rates of the sample and token counters) summed, MFU, data stall and
goodput (from the run-time counters, as contract.DERIVED computes them in PromQL)
averaged, peak memory the maximum, user scalars from the lowest rank.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import contract as c
from .histogram import Histogram
from .intervals import deltas
from .record_data import RankRecord

MIN_BIN_S = 1.0
MAX_BINS = 1500  # a long run's bins widen to keep the page small


@dataclass
class Binned:
    """Per-bin values: ``x`` the bins' end times, one list per series."""

    x: list[float]
    series: dict[str, list[float | None]] = field(default_factory=dict)


def bin_width(ranks: list[RankRecord]) -> float:
    gaps = [b.t - a.t for r in ranks for a, b in zip(r.snapshots, r.snapshots[1:], strict=False)]
    gaps = sorted(g for g in gaps if g > 0)
    times = [s.t for r in ranks for s in r.snapshots]
    span = (max(times) - min(times)) / MAX_BINS if times else 0.0
    return max(MIN_BIN_S, span, gaps[len(gaps) // 2] if gaps else 0.0)


def time_bins(ranks: list[RankRecord], width: float) -> tuple[float, int]:
    """(start, number of bins) covering every snapshot."""
    times = [s.t for r in ranks for s in r.snapshots]
    if not times:
        return 0.0, 0
    start = min(times) - width  # the first snapshot closes the first bin
    return start, int((max(times) - start) // width) + 1


def bin_index(t: float, start: float, width: float, n: int) -> int:
    """The bin time ``t`` falls in (the first or last for times outside the grid)."""
    return min(n - 1, max(0, int((t - start) // width)))


def histograms(ranks: list[RankRecord], name: str, start: float, width: float, n: int,
               by: str | None = None) -> dict[str, list[Histogram | None]]:  # fmt: skip
    """Per bin, the ranks' histogram deltas summed (by attribute ``by``, else one)."""
    out: dict[str, list[Histogram | None]] = defaultdict(lambda: [None] * n)
    for rank in ranks:
        for t, step in deltas(rank, name):
            i = bin_index(t, start, width, n)
            for attrs, h in step.items():
                label = dict(attrs).get(by, "") if by else ""
                col = out[str(label)]
                col[i] = _plus(col[i], h)
    return dict(out)


def sum_columns(columns: list[list[Histogram | None]], n: int) -> list[Histogram | None]:
    """Per bin, the histograms of several columns (ranks) added up."""
    out: list[Histogram | None] = [None] * n
    for col in columns:
        for i, h in enumerate(col):
            if h is not None:
                out[i] = _plus(out[i], h)
    return out


def _plus(a: Histogram | None, b: Histogram) -> Histogram:
    return b if a is None else a.plus(b)


def gauges(ranks: list[RankRecord], name: str, start: float, width: float, n: int,
           how: str, by: str | None = None,
           where: tuple[str, str] | None = None) -> dict[str, list[float | None]]:  # fmt: skip
    """Per bin, a gauge's last value in the bin per rank, combined across ranks by ``how``
    (sum, mean, max, first); ``where``: only points with that (attribute, value)."""
    cells: dict[str, list[dict[int, float]]] = defaultdict(lambda: [{} for _ in range(n)])
    for rank in ranks:
        for snap in rank.snapshots:
            i = bin_index(snap.t, start, width, n)
            for (metric, attrs), value in snap.values.items():
                if metric == name and not isinstance(value, Histogram):
                    if where is not None and dict(attrs).get(where[0]) != where[1]:
                        continue
                    label = str(dict(attrs).get(by, "")) if by else ""
                    cells[label][i][rank.rank] = value
    out: dict[str, list[float | None]] = {}
    for label, col in cells.items():
        out[label] = [_combine(cell, how) if cell else None for cell in col]
    return out


Values = dict[tuple[Any, ...], Any]


def from_counters(ranks: list[RankRecord], name: str, start: float, width: float, n: int,
                  how: str, value: Callable[[Values, Values | None, float], float | None],
                  ) -> list[float | None]:  # fmt: skip
    """Per bin, ``value(now, before, seconds)`` of each rank's consecutive snapshots of a
    cumulative metric (its values by attributes; ``before`` None at the first), the
    rank's last in the bin, combined across ranks by ``how``."""
    cells: list[dict[int, float]] = [{} for _ in range(n)]
    for rank in ranks:
        before: Values | None = None
        t0 = 0.0
        for snap in rank.snapshots:
            now = {attrs: v for (metric, attrs), v in snap.values.items() if metric == name}
            if not now:
                continue
            v = value(now, before, snap.t - t0) if before is None or snap.t > t0 else None
            if v is not None:
                cells[bin_index(snap.t, start, width, n)][rank.rank] = v
            before, t0 = now, snap.t
    return [_combine(cell, how) if cell else None for cell in cells]


def rate(now: Values, before: Values | None, seconds: float) -> float | None:
    """A counter's increase per second since the snapshot before (its attributes summed)."""
    if before is None:
        return None
    return (sum(now.values()) - sum(before.values())) / seconds


def _combine(cell: dict[int, float], how: str) -> float:
    values = list(cell.values())
    if how == "sum":
        return sum(values)
    if how == "max":
        return max(values)
    if how == "first":
        return cell[min(cell)]
    return sum(values) / len(values)


def last_values(rank: RankRecord, name: str) -> dict[tuple[Any, ...], Any]:
    """A metric's values in the rank's last snapshot that has it, by attributes."""
    for snap in reversed(rank.snapshots):
        found = {attrs: v for (metric, attrs), v in snap.values.items() if metric == name}
        if found:
            return found
    return {}


def run_histogram(ranks: list[RankRecord], name: str,
                  by: str | None = None) -> dict[str, Histogram]:  # fmt: skip
    """The ranks' last cumulative histograms of ``name``, summed (by attribute ``by``,
    else one, under "")."""
    out: dict[str, Histogram] = {}
    for rank in ranks:
        for attrs, h in last_values(rank, name).items():
            if isinstance(h, Histogram):
                label = str(dict(attrs).get(by, "")) if by else ""
                out[label] = _plus(out.get(label), h)
    return out


def by_category(values: Values | None) -> dict[str, float]:
    """Run-time counter values by their category."""
    return {str(dict(k).get(c.A_CATEGORY, "")): v for k, v in (values or {}).items()}


def step_quantiles(h: list[Histogram | None], q: float) -> list[float | None]:
    return [x.quantile(q) if x is not None else None for x in h]


def rank_step_means(ranks: list[RankRecord]) -> dict[int, float]:
    """Each rank's mean step time over the run (its step histogram's sum / count)."""
    out = {}
    for rank in ranks:
        (h,) = last_values(rank, c.STEP_DURATION.name).values() or (None,)
        if isinstance(h, Histogram) and h.count > 0:
            out[rank.rank] = h.total / h.count
    return out
