"""The report page's data: every chart's x, series and figures (charts.py), the rank
heatmap and straggler scores, the traced steps' waterfalls and the run summary, as plain
JSON values. The run's other processes (generators) show in the summary and in the
waterfalls, as rows ``name [role]``; the charts are the ranks'."""

from __future__ import annotations

import statistics
from typing import Any

from .. import contract as c
from ..settings.verdicts import VerdictSettings
from . import charts
from . import figures as f
from .histogram import Histogram
from .record_data import RankRecord, Run
from .run_verdicts import run_verdicts
from .summary import summary_text
from .waterfalls import waterfalls


def page_data(run: Run, title: str) -> dict[str, Any]:
    ranks = run.ranks
    width = f.bin_width(ranks)
    start, n = f.time_bins(ranks, width)
    x = [start + (i + 1) * width for i in range(n)]
    grid = (start, width, n)
    # Each rank's step histograms per bin, read once: the heatmap's rows, and summed the
    # step chart's (and the step counts the phase chart divides by).
    steps = [_one_histogram(f.histograms([r], c.STEP_DURATION.name, *grid), n) for r in ranks]
    summed = f.sum_columns(steps, n)
    out = [charts.step_chart(ranks, x, grid, summed)]
    out += charts.phase_charts(ranks, x, grid, _top_phases(ranks), summed)
    out.append(charts.memory_chart(ranks, x, grid))
    out += charts.rate_charts(ranks, x, grid)
    return {
        "title": title,
        "ranks": [r.rank for r in ranks],
        "bin_seconds": width,
        "charts": [ch for ch in out if ch["series"] or ch["figures"]],
        "heatmap": _heatmap(ranks, x, steps),
        "stragglers": _stragglers(ranks),
        "goodput": _goodput(ranks),
        "waterfalls": waterfalls(ranks, run.others),
        "summary": _summary(run),
    }


def _summary(run: Run) -> str:
    """The first rank's summary, and the run's verdicts (processing/verdicts.py)."""
    if not run.ranks:
        return ""
    found = run_verdicts(run, VerdictSettings.resolve())
    lines = [summary_text(run.ranks[0], run.others), "verdicts:" if found else ""]
    return "\n".join([*lines, *(f"  {line}" for line in found)]).rstrip("\n")


def _top_phases(ranks: list[RankRecord]) -> list[str]:
    """Phases directly under a step span in the traces (the stack's layers)."""
    steps = {s["spanId"] for r in ranks for s in r.spans if s["name"] == c.STEP_SPAN.name}
    return sorted({s["name"] for r in ranks for s in r.spans if s.get("parentSpanId") in steps})


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
        for category, value in f.by_category(f.last_values(rank, c.RUN_TIME.name)).items():
            totals[category] = totals.get(category, 0.0) + value
    wall = sum(totals.values())
    return {k: v / wall for k, v in sorted(totals.items())} if wall > 0 else {}
