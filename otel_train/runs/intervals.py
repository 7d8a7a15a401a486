"""A rank's cumulative metrics as deltas over common intervals.

In a run record every line holds every metric at one time, but a live stack's series
(live.py) come back with their own sample times: a counter's sample can fall just before
or after the histogram's of the same export. The intervals here end where a chosen
metric (the step histogram) has a sample; every metric's delta over an interval is its
last value at or before the interval's end less its last value at or before its start,
so figures of one export always land in the same interval."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from .histogram import Histogram
from .record_data import RankRecord

Values = dict[tuple[Any, ...], Any]


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


def aligned(
    rank: RankRecord, names: Sequence[str], by: str
) -> list[tuple[float, dict[str, Values]]]:
    """(end time, {metric: deltas by attributes}) of each interval between the samples of
    ``by``, the first from the start; a gauge's value is its last at or before the end."""
    ends, _ = _timeline(rank, by)
    lines = {name: _timeline(rank, name) for name in names}
    out: list[tuple[float, dict[str, Values]]] = []
    last: dict[str, Values] = {name: {} for name in names}
    for t in ends:
        deltas: dict[str, Values] = {}
        for name, (times, values) in lines.items():
            i = bisect.bisect_right(times, t + 1e-6) - 1
            now = values[i] if i >= 0 else {}
            deltas[name] = _minus(now, last[name])
            last[name] = now
        out.append((t, deltas))
    return out


def last_value(rank: RankRecord, name: str, t: float) -> Values:
    """A gauge's values at or before ``t``."""
    times, values = _timeline(rank, name)
    i = bisect.bisect_right(times, t + 1e-6) - 1
    return values[i] if i >= 0 else {}
