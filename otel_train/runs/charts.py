"""The report's charts. Each has its series per time bin (figures.py) and the run's own
figures, read from every rank's last snapshot: the page draws the curve when a series
has at least three points and shows the figures (as bars) otherwise, so a run too short
for a curve (one metric snapshot) still reads. Every series names its unit; the page
gives each unit of a chart an axis of its own ("s", "B", "1" for a share, else the unit
as its axis label)."""

from __future__ import annotations

from typing import Any

from .. import contract as c
from . import figures as f
from .histogram import Histogram
from .record_data import RankRecord
from .summary import peak_memory
from .waterfalls import slow_steps

Grid = tuple[float, float, int]
Column = list[float | None]


def series(label: str, unit: str, values: Column) -> dict[str, Any]:
    return {"label": label, "unit": unit, "values": values}


def figure(label: str, unit: str, value: float | None) -> dict[str, Any]:
    return {"label": label, "unit": unit, "value": value}


def chart(cid: str, title: str, x: list[float], lines: list[dict[str, Any]],
          figures: list[dict[str, Any]], stacked: bool = False,
          points: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    keep = [s for s in lines if any(v is not None for v in s["values"])]
    return {"id": cid, "title": title, "x": x, "stacked": stacked, "series": keep,
            "points": [s["label"] for s in keep if s["label"] in points],
            "figures": [g for g in figures if g["value"] is not None]}  # fmt: skip


def _first(by: dict[str, Column]) -> Column:
    return next(iter(by.values()), [])


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _last(ranks: list[RankRecord], spec: Any) -> list[float]:
    """Each rank's last value of a single-series gauge or counter (attributes summed)."""
    return [sum(v.values()) for r in ranks if (v := f.last_values(r, spec.name))]


def step_chart(ranks: list[RankRecord], x: list[float], grid: Grid,
               hist: list[Histogram | None]) -> dict[str, Any]:  # fmt: skip
    slow: Column = [None] * grid[2]
    for t, seconds in slow_steps(ranks):
        i = f.bin_index(t, *grid)
        slow[i] = max(seconds, slow[i] or 0.0)
    run = f.run_histogram(ranks, c.STEP_DURATION.name).get("")
    mean = run.total / run.count if run is not None and run.count else None
    return chart(
        "step", "Step time (p50 and p95 per bin, slow steps marked)", x,
        [series("p50", "s", f.step_quantiles(hist, 0.5)),
         series("p95", "s", f.step_quantiles(hist, 0.95)),
         series("slow steps (traced)", "s", slow)],
        [figure(q, "s", run.quantile(v) if run else None) for q, v in (("p50", 0.5), ("p95", 0.95))]
        + [figure("mean", "s", mean)],
        points=("slow steps (traced)",),
    )  # fmt: skip


def phase_charts(ranks: list[RankRecord], x: list[float], grid: Grid, tops: list[str],
                 steps: list[Histogram | None]) -> list[dict[str, Any]]:  # fmt: skip
    """Time per step of each phase, stacked, and each phase's share of the phase time."""
    by = f.histograms(ranks, c.PHASE_DURATION.name, *grid, by=c.A_PHASE)
    names = [p for p in tops if p in by] or sorted(by)
    counts = [h.count if h is not None else 0.0 for h in steps]
    per_step = {p: [h.total / n if h is not None and n else None
                    for h, n in zip(by[p], counts, strict=True)] for p in names}  # fmt: skip
    totals = [sum(v[i] or 0.0 for v in per_step.values()) for i in range(grid[2])]
    shares = {p: [v / t if v is not None and t else None for v, t in zip(col, totals, strict=True)]
              for p, col in per_step.items()}  # fmt: skip
    run = f.run_histogram(ranks, c.PHASE_DURATION.name, by=c.A_PHASE)
    run_steps = sum(_last(ranks, c.STEPS))
    seconds = {p: run[p].total for p in names if p in run}
    wall = sum(seconds.values())
    return [
        chart("phases", "Time per step by phase (mean per bin, stacked)", x,
              [series(p, "s", v) for p, v in per_step.items()],
              [figure(p, "s", s / run_steps if run_steps else None) for p, s in seconds.items()],
              stacked=True),
        chart("shares", "Share of phase time", x, [series(p, "1", v) for p, v in shares.items()],
              [figure(p, "1", s / wall if wall else None) for p, s in seconds.items()],
              stacked=True),
    ]  # fmt: skip


def memory_chart(ranks: list[RankRecord], x: list[float], grid: Grid) -> dict[str, Any]:
    def g(spec: Any, by: str | None = None, where: tuple[str, str] | None = None) -> Any:
        return f.gauges(ranks, spec.name, *grid, how="max", by=by, where=where)

    peaks = g(c.PHASE_MEMORY_PEAK, c.A_PHASE, where=(c.A_KIND, "allocated"))
    lines = [series(f"{k} (allocated)", "B", v) for k, v in peaks.items()]
    run_peaks: dict[str, float] = {}
    for rank in ranks:
        for k, v in peak_memory(rank).items():
            run_peaks[k] = max(v, run_peaks.get(k, 0.0))
    figures = [figure(f"{k} (allocated)", "B", v) for k, v in run_peaks.items()]
    for spec, label in ((c.DEVICE_MEMORY_LIMIT, "device limit"),
                        (c.PROCESS_MEMORY_RSS, "process RSS"),
                        (c.PROCESS_MEMORY_PEAK_RSS, "process peak RSS")):  # fmt: skip
        lines.append(series(label, "B", _first(g(spec))))
        figures.append(figure(label, "B", max(_last(ranks, spec), default=None)))
    title = "Memory: peak allocated per phase (CUDA), process resident set (max of ranks)"
    return chart("memory", title, x, lines, figures)


def _stall(now: f.Values, before: f.Values | None, seconds: float) -> float | None:
    """Data waits over step time (train + data) since ``before`` (all of it: None)."""
    a, b = f.by_category(now), f.by_category(before)
    data = a.get("data", 0.0) - b.get("data", 0.0)
    steps = data + a.get("train", 0.0) - b.get("train", 0.0)
    return data / steps if steps > 0 else None


def _goodput_at(now: f.Values, before: f.Values | None, seconds: float) -> float | None:
    """The train share of the run time so far."""
    wall = sum(now.values())
    return f.by_category(now).get("train", 0.0) / wall if wall > 0 else None


def _per_run_second(ranks: list[RankRecord], spec: Any) -> float | None:
    """A counter over each rank's run time (since its first step), summed over ranks."""
    out = [sum(f.last_values(r, spec.name).values()) / wall for r in ranks
           if (wall := sum(f.last_values(r, c.RUN_TIME.name).values())) > 0]  # fmt: skip
    return sum(out) if out else None


def _run_share(ranks: list[RankRecord], share: Any) -> float | None:
    """The mean over ranks of ``share`` of a rank's run-time counters as they ended."""
    values = [share(f.last_values(r, c.RUN_TIME.name), None, 0.0) for r in ranks]
    return _mean([v for v in values if v is not None])


def rate_charts(ranks: list[RankRecord], x: list[float], grid: Grid) -> list[dict[str, Any]]:
    """Throughput, MFU and achieved FLOP/s, data stall and goodput, the user scalars."""

    def counters(spec: Any, how: str, value: Any) -> Column:
        return f.from_counters(ranks, spec.name, *grid, how, value)

    def g(spec: Any, how: str, by: str | None = None) -> dict[str, Column]:
        return f.gauges(ranks, spec.name, *grid, how=how, by=by)

    flops = _first(g(c.THROUGHPUT_FLOPS, "sum"))
    tflops = [v / 1e12 if v is not None else None for v in flops]
    last_scalars = {str(dict(k).get(c.A_NAME)): v for k, v in
                    (f.last_values(ranks[0], c.SCALAR.name) if ranks else {}).items()}  # fmt: skip
    return [
        chart("throughput", "Throughput (all ranks)", x,
              [series("samples/s", "samples/s", counters(c.SAMPLES, "sum", f.rate)),
               series("tokens/s", "tokens/s", counters(c.TOKENS, "sum", f.rate))],
              [figure("samples/s", "samples/s", _per_run_second(ranks, c.SAMPLES)),
               figure("tokens/s", "tokens/s", _per_run_second(ranks, c.TOKENS))]),
        chart("mfu", "MFU (mean of ranks)", x,
              [series("MFU", "1", _first(g(c.MFU, "mean")))],
              [figure("MFU", "1", _mean(_last(ranks, c.MFU)))]),
        chart("tflops", "Achieved TFLOP/s (all ranks)", x, [series("TFLOP/s", "TFLOP/s", tflops)],
              [figure("TFLOP/s", "TFLOP/s", sum(_last(ranks, c.THROUGHPUT_FLOPS)) / 1e12
                      if _last(ranks, c.THROUGHPUT_FLOPS) else None)]),
        chart("stall", "Data stall share (mean of ranks)", x,
              [series("data stall", "1", counters(c.RUN_TIME, "mean", _windowed(_stall)))],
              [figure("data stall", "1", _run_share(ranks, _stall))]),
        chart("goodput", "Goodput (mean of ranks)", x,
              [series("goodput", "1", counters(c.RUN_TIME, "mean", _goodput_at))],
              [figure("goodput", "1", _run_share(ranks, _goodput_at))]),
        chart("scalars", "User scalars (lowest rank)", x,
              [series(k, "", v) for k, v in g(c.SCALAR, "first", c.A_NAME).items()],
              [figure(k, "", v) for k, v in last_scalars.items()]),
    ]  # fmt: skip


def _windowed(value: Any) -> Any:
    """``value`` between two snapshots only (None at a rank's first)."""
    return lambda now, before, seconds: value(now, before, seconds) if before is not None else None
