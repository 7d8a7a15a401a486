"""Goodput: the run's wall time split into train, data, evaluation, checkpoint, hang
(a stall the hang watch saw: hangs.py) and other.

Each instant from the first step or region to the last counts once: inside an
evaluation or checkpoint region it is that region's (a region nested in another counts
where it is not already covered), else inside a step's data phases it is data, else
inside a step it is train, else other. So the shares always sum to 100%, and an
evaluation run inside an open step (nanoGPT's ``estimate_loss()`` at the top of an
iteration, after the loader already fetched the batch) is evaluation, not train.

Regions and steps arrive in the order they end, in batches; a region's overlap with
steps is taken from train when either of them arrives, whichever is later. Memory is
bounded: the covered intervals kept (merged) and the recent steps they are compared with.
"""

from __future__ import annotations

import collections
from bisect import bisect_right

CATEGORIES = ("train", "data", "evaluation", "checkpoint", "hang", "other")
MAX_COVERED = 256  # merged region intervals kept, oldest dropped first
MAX_STEPS = 4096  # recent step extents a late region is compared with


class Goodput:
    def __init__(self) -> None:
        self.first: int | None = None
        self.last: int | None = None
        # Seconds per category but "other", which is the rest of the wall time.
        self.seconds = dict.fromkeys(CATEGORIES[:-1], 0.0)
        self._covered: list[list[int]] = []  # merged region intervals, sorted, disjoint
        self._steps: collections.deque[tuple[int, int]] = collections.deque(maxlen=MAX_STEPS)

    def add_steps(
        self, starts: list[int], ends: list[int], spans: list[float], data: list[float]
    ) -> None:
        """Finished steps in order: host extents (ns), their seconds, and seconds in
        data phases (which lie inside their steps)."""
        self._extend(starts[0], ends[-1])
        covered = self._covered
        seconds = self.seconds
        if not covered or covered[-1][1] <= starts[0]:  # no region reaches them (usual)
            in_data = sum(data)
            seconds["data"] += in_data
            seconds["train"] += max(0.0, sum(spans) - in_data)
        else:
            for s, e, d in zip(starts, ends, data, strict=True):
                rest = max(0, e - s - self._covered_in(s, e)) / 1e9
                in_data = min(d, rest)
                seconds["data"] += in_data
                seconds["train"] += rest - in_data
        self._steps.extend(zip(starts, ends, strict=True))

    def add_region(self, kind: str, t0: int, t1: int) -> None:
        """An evaluation or checkpoint region that ended, or a stall (kind "hang")."""
        self._extend(t0, t1)
        if t1 <= t0:
            return
        new = t1 - t0 - self._covered_in(t0, t1)
        overlap = 0  # of steps already counted, in the part no region covered yet
        for s, e in reversed(self._steps):
            if e <= t0:
                break
            a, b = max(s, t0), min(e, t1)
            if b > a:
                overlap += b - a - self._covered_in(a, b)
        self.seconds[kind] += new / 1e9
        self._take_from_steps(overlap / 1e9)
        self._cover(t0, t1)

    def _take_from_steps(self, seconds: float) -> None:
        """Time already counted as train (then data) that a late region covers."""
        got = self.seconds
        from_train = min(got["train"], seconds)
        got["train"] -= from_train
        got["data"] = max(0.0, got["data"] - (seconds - from_train))

    def _covered_in(self, a: int, b: int) -> int:
        """Nanoseconds of [a, b) inside covered intervals."""
        covered = self._covered
        i = max(0, bisect_right(covered, [a]) - 1)
        total = 0
        for lo, hi in covered[i:]:
            if lo >= b:
                break
            total += max(0, min(hi, b) - max(lo, a))
        return total

    def _cover(self, a: int, b: int) -> None:
        """Merge [a, b) into the covered intervals (bounded)."""
        covered = self._covered
        i = bisect_right(covered, [a])
        if i and covered[i - 1][1] >= a:
            i -= 1
        j = i
        while j < len(covered) and covered[j][0] <= b:
            a, b = min(a, covered[j][0]), max(b, covered[j][1])
            j += 1
        covered[i:j] = [[a, b]]
        if len(covered) > MAX_COVERED:
            del covered[0]

    def _extend(self, t0: int, t1: int) -> None:
        if self.first is None or t0 < self.first:
            self.first = t0
        if self.last is None or t1 > self.last:
            self.last = t1

    def wall(self) -> float:
        if self.first is None or self.last is None:
            return 0.0
        return max(0, self.last - self.first) / 1e9

    def totals(self) -> dict[str, float]:
        """Seconds per category, "other" the rest of the wall time: they sum to it."""
        out = dict(self.seconds)
        out["other"] = max(0.0, self.wall() - sum(out.values()))
        return out
