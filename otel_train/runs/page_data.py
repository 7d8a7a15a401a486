"""The report page's data: every chart's x and series, the rank heatmap and straggler
scores, the traced steps' waterfalls and the run summary, as plain JSON values."""

from __future__ import annotations

import statistics
from typing import Any

from .. import contract as c
from . import figures as f
from .record_data import Histogram, RankRecord
from .summary import summary_text
from .waterfalls import slow_steps, waterfalls


def page_data(ranks: list[RankRecord], title: str) -> dict[str, Any]:
    width = f.bin_width(ranks)
    start, n = f.time_bins(ranks, width)
    x = [start + (i + 1) * width for i in range(n)]
    grid = (start, width, n)
    # Each rank's step histograms per bin, read once: the heatmap's rows, and summed the
    # step chart's.
    steps = [_one_histogram(f.histograms([r], c.STEP_DURATION.name, *grid), n) for r in ranks]
    charts = [_step_chart(ranks, x, grid, f.sum_columns(steps, n))]
    charts += _phase_charts(ranks, x, grid, _top_phases(ranks))
    charts += _gauge_charts(ranks, x, grid)
    return {
        "title": title,
        "ranks": [r.rank for r in ranks],
        "bin_seconds": width,
        "charts": [ch for ch in charts if ch["series"]],
        "heatmap": _heatmap(ranks, x, steps),
        "stragglers": _stragglers(ranks),
        "goodput": _goodput(ranks),
        "waterfalls": waterfalls(ranks),
        "summary": summary_text(ranks[0]) if ranks else "",
    }


def _chart(cid: str, title: str, unit: str, x: list[float], series: dict[str, Any],
           stacked: bool = False, points: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    keep = {k: v for k, v in series.items() if any(y is not None for y in v)}
    return {"id": cid, "title": title, "unit": unit, "x": x, "stacked": stacked,
            "points": [p for p in points if p in keep],
            "series": [{"label": k, "values": v} for k, v in keep.items()]}  # fmt: skip


def _step_chart(ranks: list[RankRecord], x: list[float], grid: tuple[float, float, int],
                hist: list[Histogram | None]) -> dict[str, Any]:  # fmt: skip
    series = {"p50": f.step_quantiles(hist, 0.5), "p95": f.step_quantiles(hist, 0.95)}
    slow: list[float | None] = [None] * grid[2]
    for t, seconds in slow_steps(ranks):
        i = f.bin_index(t, *grid)
        slow[i] = max(seconds, slow[i] or 0.0)
    series["slow steps (traced)"] = slow
    return _chart("step", "Step time (p50 and p95 per bin, slow steps marked)", "s", x, series,
                  points=("slow steps (traced)",))  # fmt: skip


def _top_phases(ranks: list[RankRecord]) -> list[str]:
    """Phases directly under a step span in the traces (the stack's layers)."""
    steps = {s["spanId"] for r in ranks for s in r.spans if s["name"] == c.STEP_SPAN.name}
    return sorted({s["name"] for r in ranks for s in r.spans if s.get("parentSpanId") in steps})


def _phase_charts(ranks: list[RankRecord], x: list[float], grid: tuple[float, float, int],
                  tops: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    by = f.histograms(ranks, c.PHASE_DURATION.name, *grid, by=c.A_PHASE)
    names = [p for p in tops if p in by] or sorted(by)
    seconds = {p: [h.total if h else None for h in by[p]] for p in names}
    totals = [sum(v[i] or 0.0 for v in seconds.values()) for i in range(grid[2])]
    shares = {p: [(v or 0.0) / t if t else None for v, t in zip(col, totals, strict=True)]
              for p, col in seconds.items()}  # fmt: skip
    return [
        _chart("phases", "Time per phase (seconds per bin, stacked)", "s", x, seconds, True),
        _chart("shares", "Share of phase time", "1", x, shares, True),
    ]


def _gauge_charts(ranks: list[RankRecord], x: list[float],
                  grid: tuple[float, float, int]) -> list[dict[str, Any]]:  # fmt: skip
    def g(spec: Any, how: str, by: str | None = None,
          where: tuple[str, str] | None = None) -> dict[str, list[float | None]]:  # fmt: skip
        return f.gauges(ranks, spec.name, *grid, how=how, by=by, where=where)

    peaks = g(c.PHASE_MEMORY_PEAK, "max", c.A_PHASE, where=(c.A_KIND, "allocated"))
    memory = {f"{k} (allocated)": v for k, v in peaks.items()}
    limit = _one(g(c.DEVICE_MEMORY_LIMIT, "max"))
    if limit:
        memory["device limit"] = limit
    flops = {
        "TFLOP/s": [v / 1e12 if v is not None else None for v in _one(g(c.THROUGHPUT_FLOPS, "sum"))]
    }
    return [
        _chart("memory", "Peak memory per phase against the device limit", "B", x, memory),
        _chart(
            "throughput",
            "Throughput (all ranks)",
            "/s",
            x,
            {
                "samples/s": f.from_counters(ranks, c.SAMPLES.name, *grid, "sum", f.rate),
                "tokens/s": f.from_counters(ranks, c.TOKENS.name, *grid, "sum", f.rate),
            },
        ),
        _chart("mfu", "MFU (mean of ranks)", "1", x, {"MFU": _one(g(c.MFU, "mean"))}),
        _chart("tflops", "Achieved TFLOP/s (all ranks)", "", x, flops),
        _chart(
            "stall",
            "Data stall share (mean of ranks)",
            "1",
            x,
            {"data stall": f.from_counters(ranks, c.RUN_TIME.name, *grid, "mean", _stall)},
        ),
        _chart(
            "goodput",
            "Goodput (mean of ranks)",
            "1",
            x,
            {"goodput": f.from_counters(ranks, c.RUN_TIME.name, *grid, "mean", _goodput_at)},
        ),
        _chart("scalars", "User scalars (lowest rank)", "", x, g(c.SCALAR, "first", c.A_NAME)),
    ]


def _by_category(values: f.Values | None) -> dict[str, float]:
    """Run-time counter values by their category."""
    return {str(dict(k).get(c.A_CATEGORY, "")): v for k, v in (values or {}).items()}


def _stall(now: f.Values, before: f.Values | None, seconds: float) -> float | None:
    """Data waits over step time (train + data) since the snapshot before."""
    a, b = _by_category(now), _by_category(before)
    data = a.get("data", 0.0) - b.get("data", 0.0)
    steps = data + a.get("train", 0.0) - b.get("train", 0.0)
    return data / steps if before is not None and steps > 0 else None


def _goodput_at(now: f.Values, before: f.Values | None, seconds: float) -> float | None:
    """The train share of the run time so far."""
    wall = sum(now.values())
    return _by_category(now).get("train", 0.0) / wall if wall > 0 else None


def _one(d: dict[str, list[float | None]]) -> list[float | None]:
    return next(iter(d.values()), [])


def _one_histogram(d: dict[str, list[Histogram | None]], n: int) -> list[Histogram | None]:
    return next(iter(d.values()), [None] * n)


def _heatmap(ranks: list[RankRecord], x: list[float],
             steps: list[list[Histogram | None]]) -> dict[str, Any]:  # fmt: skip
    rows = [[h.total / h.count if h and h.count else None for h in col] for col in steps]
    return {"x": x, "ranks": [r.rank for r in ranks], "values": rows}


def _stragglers(ranks: list[RankRecord]) -> dict[str, Any]:
    """Each rank's mean step time against the ranks' median (1.0: typical)."""
    means = f.rank_step_means(ranks)
    if not means:
        return {"scores": [], "slowest": None}
    median = statistics.median(means.values())
    scores = [{"rank": r, "mean_step_s": m, "score": m / median if median else None}
              for r, m in sorted(means.items())]  # fmt: skip
    slowest = max(means, key=means.__getitem__) if len(means) > 1 else None
    return {"scores": scores, "slowest": slowest}


def _goodput(ranks: list[RankRecord]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for rank in ranks:
        for category, value in _by_category(f.last_values(rank, c.RUN_TIME.name)).items():
            totals[category] = totals.get(category, 0.0) + value
    wall = sum(totals.values())
    return {k: v / wall for k, v in sorted(totals.items())} if wall > 0 else {}
