"""A rank's cumulative metrics as deltas over common intervals.

In a run record every line holds every metric at one time, but a live stack's series
(live.py) come back with their own sample times: a counter's sample can fall just before
or after the histogram's of the same export. The intervals here end where a chosen
metric (the step histogram) has a sample. A metric's samples belong to the interval end
nearest them: each end reads a metric's last value at or before its cut, the midpoint
to the next end (the last end's cut lies as far past it as half the gap before it). A
metric's delta over an interval is its value at the interval's cut less its value at
the cut before, so figures of one export land in the same interval whether they were
sampled a moment before the step histogram or a moment after."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import contract as c
from .histogram import Histogram
from .record_data import RankRecord

Values = dict[tuple[Any, ...], Any]


@dataclass(frozen=True)
class Interval:
    end: float  # the chosen metric's sample time
    cut: float  # where samples stop counting for this interval (see the module's text)
    deltas: dict[str, Values]  # by metric name, then by attributes


def _timeline(rank: RankRecord, name: str) -> tuple[list[float], list[Values]]:
    """(times, cumulative values by attributes) of each snapshot holding ``name``."""
    times: list[float] = []
    values: list[Values] = []
    for snap in rank.snapshots:
        found = {attrs: v for (metric, attrs), v in snap.values.items() if metric == name}
        if found:
            times.append(snap.t)
            values.append(found)
    return times, values


def _minus(now: Values, before: Values) -> Values:
    out: Values = {}
    for attrs, v in now.items():
        old = before.get(attrs)
        out[attrs] = v.minus(old) if isinstance(v, Histogram) else v - (old or 0.0)
    return out


def cuts(ends: Sequence[float]) -> list[float]:
    """Each end's cut: the midpoint to the next end; the last's half the gap before it
    past it (a moment past it for a single end)."""
    out = [(a + b) / 2.0 for a, b in itertools.pairwise(ends)]
    if ends:
        out.append(ends[-1] + ((ends[-1] - ends[-2]) / 2.0 if len(ends) > 1 else 1e-6))
    return out


def _at(times: list[float], values: list[Values], t: float) -> Values:
    i = bisect.bisect_right(times, t) - 1
    return values[i] if i >= 0 else {}


def aligned(rank: RankRecord, names: Sequence[str], by: str) -> list[Interval]:
    """The intervals between the samples of ``by`` (the first from the start), with each
    metric's deltas over them."""
    ends, _ = _timeline(rank, by)
    lines = {name: _timeline(rank, name) for name in names}
    out: list[Interval] = []
    last: dict[str, Values] = {name: {} for name in names}
    for end, cut in zip(ends, cuts(ends), strict=True):
        deltas: dict[str, Values] = {}
        for name, (times, values) in lines.items():
            now = _at(times, values, cut)
            deltas[name] = _minus(now, last[name])
            last[name] = now
        out.append(Interval(end, cut, deltas))
    return out


def deltas(rank: RankRecord, name: str) -> list[tuple[float, Values]]:
    """(time, {attributes: delta}) of a cumulative metric over the intervals between the
    rank's step histogram samples (between its own where the rank has no step histogram)."""
    by = c.STEP_DURATION.name if _timeline(rank, c.STEP_DURATION.name)[0] else name
    return [(i.end, i.deltas[name]) for i in aligned(rank, (name,), by)]


def last_value(rank: RankRecord, name: str, t: float) -> Values:
    """A gauge's values at or before ``t`` (an interval's cut)."""
    return _at(*_timeline(rank, name), t)
