"""A rank's steady-state steps, read from its run record, as the samples compare.py and
the verdicts work on.

When the record traced every step (``trace_steps="all"``) each steady step is one
sample, from its step span and its phase spans. Otherwise each interval between two
metric snapshots is one sample: the mean of its steps, from the deltas of the cumulative
histograms and counters over the step histogram's intervals (intervals.py).

Left out, and counted by reason: the first ``warmup`` steps (compilation, autotuning,
caches), the step whose FLOPs were counted (``otel_train.step.flops.counted``: it runs
under the counter), steps in a debugging window (an ``otel_train.profile`` or
``otel_train.memory_snapshot`` event on the step span) and steps that raised. An
interval is left out whole when it holds any such step. The record does not mark later
recompiles: a step shape traced for being new (``sampled_because=shape``) is left out
where it is known, as a recompile usually comes with one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import contract as c
from . import figures as f
from .histogram import Histogram
from .intervals import aligned, last_value
from .record_data import RankRecord

WARMUP_STEPS = 5
_DEBUG_EVENTS = frozenset({c.PROFILE_EVENT, c.MEMORY_SNAPSHOT_EVENT})
_STATUS_ERROR = 2


@dataclass
class Sample:
    """One step, or the mean step of one interval (``steps`` of them)."""

    steps: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step, by phase
    data_stall: float | None = None  # share of the step
    collective_wait: float | None = None  # seconds per step
    mfu: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None


@dataclass
class Steady:
    rank: int
    unit: str  # "step" or "interval"
    samples: list[Sample]
    left_out: dict[str, int]  # steps, by reason


def _duration(attrs: dict[str, Any]) -> float:
    device = attrs.get(c.PHASE_DEVICE_DURATION.key)
    return float(device if device is not None else attrs.get(c.PHASE_HOST_DURATION.key) or 0.0)


def total_steps(rank: RankRecord) -> int:
    return int(sum(f.last_values(rank, c.STEPS.name).values()))


def _why_left_out(span: dict[str, Any], warmup: int) -> str | None:
    a = span["attributes"]
    if int(a.get(c.STEP_INDEX.key, 0)) < warmup:
        return "warm-up"
    if a.get(c.STEP_FLOPS_COUNTED.key):
        return "FLOP-count step"
    if _DEBUG_EVENTS & {e.get("name") for e in span.get("events", ())}:
        return "debugging window"
    if span.get("status", {}).get("code") == _STATUS_ERROR:
        return "error"
    if a.get(c.STEP_SAMPLED_BECAUSE.key) == "shape":
        return "new step shape"
    return None


def _step_spans(rank: RankRecord) -> dict[int, dict[str, Any]]:
    return {
        int(s["attributes"].get(c.STEP_INDEX.key, -1)): s
        for s in rank.spans
        if s["name"] == c.STEP_SPAN.name
    }


def _phase_seconds(rank: RankRecord) -> dict[str, dict[str, float]]:
    """Seconds by phase name under each step span (by its span id): each phase span goes
    to the step span above it (a trace may hold several steps: step(parent=carrier))."""
    by_id = {s["spanId"]: s for s in rank.spans}
    out: dict[str, dict[str, float]] = {}
    for s in rank.spans:
        if s["name"] == c.STEP_SPAN.name:
            continue
        up, hops = by_id.get(s.get("parentSpanId", "")), 0
        while up is not None and up["name"] != c.STEP_SPAN.name and hops < 64:
            up, hops = by_id.get(up.get("parentSpanId", "")), hops + 1
        if up is not None and up["name"] == c.STEP_SPAN.name:
            by = out.setdefault(up["spanId"], {})
            by[s["name"]] = by.get(s["name"], 0.0) + _duration(s["attributes"])
    return out


def _from_spans(rank: RankRecord, steps: dict[int, dict[str, Any]], warmup: int) -> Steady:
    phases = _phase_seconds(rank)
    samples: list[Sample] = []
    left_out: dict[str, int] = {}
    for _, span in sorted(steps.items()):
        why = _why_left_out(span, warmup)
        if why is not None:
            left_out[why] = left_out.get(why, 0) + 1
            continue
        a = span["attributes"]
        seconds = float(a.get(c.STEP_HOST_DURATION.key) or 0.0)
        samples.append(Sample(1, seconds, phases.get(span["spanId"], {}),
                              a.get(c.STEP_DATA_STALL.key),
                              float(a.get(c.STEP_COLLECTIVE_WAIT.key) or 0.0),
                              a.get(c.STEP_MFU.key), a.get(c.STEP_THROUGHPUT_SAMPLES.key),
                              a.get(c.STEP_THROUGHPUT_TOKENS.key)))  # fmt: skip
    return Steady(rank.rank, "step", samples, left_out)


def _marked(steps: dict[int, dict[str, Any]], warmup: int) -> dict[int, str]:
    """The traced steps that are to be left out (a sampled record traces these)."""
    out = {}
    for index, span in steps.items():
        why = _why_left_out(span, warmup)
        if why is not None and why != "warm-up":
            out[index] = why
    return out


_CUMULATIVE = (c.STEP_DURATION.name, c.PHASE_DURATION.name, c.SAMPLES.name, c.TOKENS.name,
               c.RUN_TIME.name, c.COLLECTIVE_DURATION.name)  # fmt: skip


def _from_intervals(rank: RankRecord, steps: dict[int, dict[str, Any]], warmup: int) -> Steady:
    marked = _marked(steps, warmup)
    samples: list[Sample] = []
    left_out: dict[str, int] = {}
    done = 0
    for interval in aligned(rank, _CUMULATIVE, c.STEP_DURATION.name):
        deltas = interval.deltas
        h = next(iter(deltas[c.STEP_DURATION.name].values()), None)
        if not isinstance(h, Histogram) or h.count <= 0:
            continue
        n, first = int(h.count), done
        done += n
        why = "warm-up" if first < warmup else None
        why = why or next((marked[i] for i in range(first, done) if i in marked), None)
        if why is not None:
            left_out[why] = left_out.get(why, 0) + n
            continue
        mfu = sum(last_value(rank, c.MFU.name, interval.cut).values()) or None
        samples.append(_interval(n, h.total, deltas, mfu))
    return Steady(rank.rank, "interval", samples, left_out)


def _interval(n: int, seconds: float, deltas: dict[str, Any], mfu: float | None) -> Sample:
    def total(name: str) -> float:
        return sum(v.total if isinstance(v, Histogram) else v for v in deltas[name].values())

    phases = {str(dict(k).get(c.A_PHASE)): h.total / n
              for k, h in deltas[c.PHASE_DURATION.name].items()}  # fmt: skip
    run = f.by_category(deltas[c.RUN_TIME.name])
    in_steps = run.get("train", 0.0) + run.get("data", 0.0)
    return Sample(n, seconds / n, phases,
                  run.get("data", 0.0) / in_steps if in_steps > 0 else None,
                  total(c.COLLECTIVE_DURATION.name) / n, mfu,
                  total(c.SAMPLES.name) / seconds if seconds > 0 else None,
                  total(c.TOKENS.name) / seconds if seconds > 0 else None)  # fmt: skip


def steady(rank: RankRecord, warmup: int = WARMUP_STEPS) -> Steady:
    """The rank's steady steps: from its spans when it traced (nearly) every step."""
    steps = _step_spans(rank)
    if steps and len(steps) >= 0.9 * total_steps(rank):
        return _from_spans(rank, steps, warmup)
    return _from_intervals(rank, steps, warmup)
