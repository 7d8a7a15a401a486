"""Which steps become traces.

Metrics and console tables see every step; spans cost ~20 us each in the Python
SDK, so by default only a sample of steps is traced: per window (``trace_window``
steps or ``trace_window_seconds``, whichever closes first) the ``trace_slowest``
slowest steps, plus every step that raised and the run's first step. ``all`` traces
every step, ``none`` none.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from .resolved import ResolvedStep


class StepSampler:
    def __init__(self, mode: str, window: int, window_seconds: float, slowest: int) -> None:
        self.mode = mode
        self._window = window
        self._window_ns = int(window_seconds * 1e9)
        self._slowest = slowest
        self._heap: list[tuple[int, int, ResolvedStep]] = []
        self._count = 0
        self._window_start: int | None = None
        self._first_seen = False
        self.always: Callable[[int], bool] | None = None  # steps traced whatever their time

    def offer(self, step: ResolvedStep) -> list[ResolvedStep]:
        """Steps to emit now (most calls return an empty list)."""
        if self.mode == "none":
            return []
        if self.mode == "all":
            step.sampled_because = "all"
            return [step]
        out: list[ResolvedStep] = []
        if not self._first_seen:
            self._first_seen = True
            step.sampled_because = "first"
            out.append(step)
        elif step.error:
            step.sampled_because = "error"
            out.append(step)
        elif self.always is not None and self.always(step.index):
            step.sampled_because = "debug"  # a profiled step or a memory-snapshot window's end
            out.append(step)
        elif self._slowest:
            duration = step.end - step.start
            item = (duration, step.index, step)
            if len(self._heap) < self._slowest:
                heapq.heappush(self._heap, item)
            elif item[:2] > self._heap[0][:2]:
                heapq.heapreplace(self._heap, item)
        if self._window_start is None:
            self._window_start = step.host_start
        self._count += 1
        if self._count >= self._window or step.host_end - self._window_start >= self._window_ns:
            out.extend(self.close_window())
        return out

    def close_if_idle(self, now_ns: int) -> list[ResolvedStep]:
        """Close a window whose time ran out while no step arrived."""
        if self._window_start is not None and now_ns - self._window_start >= self._window_ns:
            return self.close_window()
        return []

    def close_window(self) -> list[ResolvedStep]:
        chosen = sorted((s for _, _, s in self._heap), key=lambda s: s.index)
        for s in chosen:
            s.sampled_because = "slowest"
        self._heap.clear()
        self._count = 0
        self._window_start = None
        return chosen
