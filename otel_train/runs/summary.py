"""The run summary in the console's table form, from a rank's last metric snapshot:
cumulative time per phase with its share of wall time, calls, and peak memory per phase
with its share of the device; time waiting in collectives; then the run's other
processes' phases (a generator's
rollouts: ``rollout [generator]``, from its own record), which take no share of the
trainer's wall time (they ran beside it)."""

from __future__ import annotations

from collections.abc import Sequence

from .. import contract as c
from ..processing.console import fmt_bytes, fmt_seconds
from ..recording.collectives import label, phase_name
from . import figures as f
from .histogram import Histogram
from .record_data import RankRecord


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


def remote_rows(
    others: Sequence[RankRecord],
) -> dict[str, tuple[float, float, float | None, float]]:
    """The other processes' outermost phases (a generator's rollouts, under the trainer's
    steps), by ``name [role]``: (seconds, calls, peak allocated, their device's memory)."""
    rows: dict[str, tuple[float, float, float | None, float]] = {}
    for other in others:
        depths, peaks = phase_depths(other), peak_memory(other)
        limit = max(f.last_values(other, c.DEVICE_MEMORY_LIMIT.name).values(), default=0.0)
        for attrs, h in f.last_values(other, c.PHASE_DURATION.name).items():
            name = str(dict(attrs).get(c.A_PHASE))
            if not isinstance(h, Histogram) or depths.get(name, 0):
                continue
            key = f"{name} [{other.role}]"
            seconds, calls, peak, device = rows.get(key, (0.0, 0.0, None, 0.0))
            mine = peaks.get(name)
            peak = mine if peak is None else max(peak, mine or 0.0)
            rows[key] = (seconds + h.total, calls + h.count, peak, max(device, limit))
    return rows


def wait_rows(rank: RankRecord) -> list[str]:
    """Time in collectives (otel_train.collective.duration): a row per collective, and its
    share of step time, as the console's summary says it."""
    wall = sum(f.last_values(rank, c.RUN_TIME.name).values())
    rows, total = [], 0.0
    waits = f.last_values(rank, c.COLLECTIVE_DURATION.name)
    for attrs, h in sorted(waits.items(), key=lambda kv: -kv[1].total if kv[1] else 0.0):
        if not isinstance(h, Histogram):
            continue
        a = dict(attrs)
        name = label(phase_name(str(a.get(c.A_COLLECTIVE_OP)), str(a.get(c.A_COLLECTIVE_GROUP))))
        share = f"{100.0 * h.total / wall:>8.1f}%" if wall > 0 else f"{'-':>9}"
        rows.append(f"{name:<24}{fmt_seconds(h.total):>12}{share}{h.count:>8.0f}{'-':>13}{'-':>10}")
        total += h.total
    steps = [h for h in f.last_values(rank, c.STEP_DURATION.name).values() if h]
    in_steps = sum(h.total for h in steps if isinstance(h, Histogram))
    if total > 0 and in_steps > 0:
        rows.append(f"waiting in collectives {100.0 * total / in_steps:.1f}% of step time")
    return rows


def summary_text(rank: RankRecord, others: Sequence[RankRecord] = ()) -> str:
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
    lines += wait_rows(rank)
    for label, (seconds, calls, peak, limit) in sorted(remote_rows(others).items()):
        device = f"{100.0 * peak / limit:.1f}%" if peak is not None and limit else "-"
        lines.append(f"{label:<24}{fmt_seconds(seconds):>12}{'-':>9}{calls:>8.0f}"
                     f"{fmt_bytes(peak):>13}{device:>10}")  # fmt: skip
    return "\n".join(lines)
