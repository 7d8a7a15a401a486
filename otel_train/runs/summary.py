"""The run summary in the console's table form, from a rank's last metric snapshot:
cumulative time per phase with its share of wall time, calls, and peak memory per phase
with its share of the device."""

from __future__ import annotations

from .. import contract as c
from ..recording.console import fmt_bytes, fmt_seconds
from . import figures as f
from .record_data import Histogram, RankRecord


def phase_depths(rank: RankRecord) -> dict[str, int]:
    """Each phase name's nesting depth under its step, from the traced steps."""
    by_id = {s["spanId"]: s for s in rank.spans}
    depths: dict[str, int] = {}
    for s in rank.spans:
        if s["name"] == c.STEP_SPAN.name:
            continue
        depth, parent = 0, by_id.get(s.get("parentSpanId", ""))
        while parent is not None and parent["name"] != c.STEP_SPAN.name and depth < 64:
            depth += 1
            parent = by_id.get(parent.get("parentSpanId", ""))
        depths.setdefault(s["name"], depth)
    return depths


def peak_memory(rank: RankRecord) -> dict[str, float]:
    """Each phase's highest allocated peak over the run."""
    peaks: dict[str, float] = {}
    for snap in rank.snapshots:
        for (metric, attrs), value in snap.values.items():
            a = dict(attrs)
            if metric == c.PHASE_MEMORY_PEAK.name and a.get(c.A_KIND) == "allocated":
                phase = str(a.get(c.A_PHASE))
                peaks[phase] = max(peaks.get(phase, 0.0), value)
    return peaks


def summary_text(rank: RankRecord) -> str:
    steps = sum(f.last_values(rank, c.STEPS.name).values())
    wall = sum(f.last_values(rank, c.RUN_TIME.name).values())
    limit = max(f.last_values(rank, c.DEVICE_MEMORY_LIMIT.name).values(), default=0.0)
    lines = [f"rank {rank.rank}: {steps:,.0f} steps, wall clock {fmt_seconds(wall)} "
             "(since the first step)"]  # fmt: skip
    lines.append(f"{'phase':<24}{'total':>12}{'% wall':>9}{'calls':>8}"
                 f"{'peak alloc':>13}{'% device':>10}")  # fmt: skip
    depths, peaks = phase_depths(rank), peak_memory(rank)
    phases = {
        str(dict(attrs).get(c.A_PHASE)): h
        for attrs, h in f.last_values(rank, c.PHASE_DURATION.name).items()
        if isinstance(h, Histogram)
    }
    for name, h in sorted(phases.items(), key=lambda kv: (depths.get(kv[0], 0), -kv[1].total)):
        share = f"{100.0 * h.total / wall:>8.1f}%" if wall > 0 else f"{'-':>9}"
        peak = peaks.get(name)
        device = f"{100.0 * peak / limit:.1f}%" if peak is not None and limit else "-"
        label = "  " * depths.get(name, 0) + name
        lines.append(f"{label:<24}{fmt_seconds(h.total):>12}{share}{h.count:>8.0f}"
                     f"{fmt_bytes(peak):>13}{device:>10}")  # fmt: skip
    return "\n".join(lines)
