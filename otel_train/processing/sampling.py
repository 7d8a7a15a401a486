"""Which steps become traces.

Metrics and console tables see every step; spans cost ~20 us each in the Python
SDK, so by default only a sample of steps is traced: per window (``trace_window``
steps or ``trace_window_seconds``, whichever closes first) the ``trace_slowest``
slowest steps, plus every step that raised, the first step of each instrumentation
(the run's first step among them), the first step of each step shape not seen
before (at most ``MAX_NEW_SHAPES`` a run) and every step in a sampled trace across
processes (links.py: it handed out a sampled carrier, or joined one) or linking to a
sampled rollout's span (tokens.py: consumed). ``all`` traces
every step, ``none`` none.

The step whose FLOPs were counted is no candidate for the slowest: counting makes it
slow (tens of ms), and a trace of it says nothing about training.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from typing import Any

from ..recording.layouts import Step
from .blocks import StepBlock

MAX_NEW_SHAPES = 64  # step shapes traced for being new; later new shapes are not


def _because(step: Step, reason: str) -> Step:
    step.sampled_because = reason
    return step


class StepSampler:
    def __init__(
        self,
        mode: str,
        window: int,
        window_seconds: float,
        slowest: int,
    ) -> None:
        self.mode = mode
        self._window = window
        self._window_ns = int(window_seconds * 1e9)
        self._slowest = slowest
        self._heap: list[tuple[int, int, Step]] = []
        self._count = 0
        self._window_start: int | None = None
        # Indices from which the first step is traced (each instrumentation's), in order
        self._first_from: list[int] = [0]
        self._shapes: set[Any] = set()

    def trace_first_from(self, index: int) -> None:
        """Trace the first step whose index is ``index`` or later (a new
        instrumentation's first step; any thread)."""
        if len(self._first_from) < MAX_NEW_SHAPES:  # (bounded: one per instrumentation)
            self._first_from.append(index)

    def offer(self, block: StepBlock) -> list[Step]:
        """Steps of a block to emit now (most calls return an empty list), in the order
        one step at a time would give them; only the steps kept are built."""
        if self.mode == "none":
            return []
        if self.mode == "all":
            return [_because(block.step(i), "all") for i in range(block.k)]
        special = self._special(block)
        in_order = sorted(special)
        out: list[Step] = []
        k, starts, ends = block.k, block.starts, block.ends
        i = 0
        while i < k:
            if self._window_start is None:
                self._window_start = starts[i]
            # The step that closes this window: by count, or the first to end past its time.
            closes = min(
                i + self._window - self._count - 1,
                bisect_left(ends, self._window_start + self._window_ns, i, k),
            )
            j = min(closes, k - 1)
            out.extend(_because(block.step(x), special[x]) for x in in_order if i <= x <= j)
            if self._slowest:
                self._keep_slowest(block, i, j, special)
            self._count += j - i + 1
            if closes < k:
                out.extend(self.close_window())
            i = j + 1
        return out

    def _special(self, block: StepBlock) -> dict[int, str]:
        """Offsets of a block's steps traced whatever their time, with the reason: the
        run's first step, a step that raised, a step in a sampled trace across processes,
        a step the debug tools asked for."""
        special: dict[int, str] = {}
        end = block.first + block.k
        while self._first_from and self._first_from[0] < end:
            special[max(0, self._first_from.pop(0) - block.first)] = "first"
        for x in block.errors:
            special.setdefault(x, "error")
        for x in block.linked:  # (the other process's part of the trace needs this one)
            link = block.step(x).link
            reason = link.reason if link is not None and link.sampled else "consumed"
            special.setdefault(x, reason)
        key = block.shape.key
        if key not in self._shapes and len(self._shapes) < MAX_NEW_SHAPES:
            self._shapes.add(key)
            special.setdefault(0, "shape")
        for x in block.debug:  # (a profiled step, the end of a memory-snapshot window)
            special.setdefault(x, "debug")
        return special

    def _keep_slowest(self, block: StepBlock, i: int, j: int, special: dict[int, str]) -> None:
        """Steps ``i`` .. ``j`` of a block (one window) as candidates for its slowest."""
        first, durations = block.first, block.durations
        eff = block.efficiency
        counted = eff.counted if eff is not None and any(eff.counted) else None
        if not special and counted is None:  # (the usual window: C-level pairs)
            candidates: Any = zip(
                durations[i : j + 1], range(first + i, first + j + 1), strict=True
            )
        else:
            candidates = [
                (durations[x], first + x)
                for x in range(i, j + 1)
                if x not in special and (counted is None or not counted[x])
            ]
        heap, slowest = self._heap, self._slowest
        for d, index in heapq.nlargest(slowest, candidates):
            if len(heap) < slowest:
                heapq.heappush(heap, (d, index, block.step(index - first)))
            elif (d, index) > heap[0][:2]:
                heapq.heapreplace(heap, (d, index, block.step(index - first)))

    def close_if_idle(self, now_ns: int) -> list[Step]:
        """Close a window whose time ran out while no step arrived."""
        if self._window_start is not None and now_ns - self._window_start >= self._window_ns:
            return self.close_window()
        return []

    def close_window(self) -> list[Step]:
        chosen = sorted((s for _, _, s in self._heap), key=lambda s: s.index)
        for s in chosen:
            s.sampled_because = "slowest"
        self._heap.clear()
        self._count = 0
        self._window_start = None
        return chosen
