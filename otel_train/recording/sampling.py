"""Which steps become traces.

Metrics and console tables see every step; spans cost ~20 us each in the Python
SDK, so by default only a sample of steps is traced: per window (``trace_window``
steps or ``trace_window_seconds``, whichever closes first) the ``trace_slowest``
slowest steps, plus every step that raised and the run's first step. ``all`` traces
every step, ``none`` none.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable
from operator import sub

from .blocks import StepBlock
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

    def takes_blocks(self) -> bool:
        """Whether ``offer_block`` gives what ``offer`` per step would (else: one by one)."""
        return self.mode != "all" and self.always is None

    def offer_block(self, block: StepBlock) -> list[ResolvedStep]:
        """``offer`` for each of a block's steps, building only the steps it keeps."""
        if self.mode == "none":
            return []
        out: list[ResolvedStep] = []
        k, first = block.k, block.first
        starts, ends = block.starts, block.ends
        lo = 0
        if not self._first_seen:
            self._first_seen = True
            step = block.step(0)
            step.sampled_because = "first"
            out.append(step)
            lo = 1  # traced already: not a candidate for the slowest
        durations = list(map(sub, ends, starts))  # end - start: host times only in a block
        heap, slowest = self._heap, self._slowest
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
            if slowest and max(i, lo) <= j:
                a = max(i, lo)
                for d, index in heapq.nlargest(
                    slowest, zip(durations[a : j + 1], range(first + a, first + j + 1), strict=True)
                ):
                    if len(heap) < slowest:
                        heapq.heappush(heap, (d, index, block.step(index - first)))
                    elif (d, index) > heap[0][:2]:
                        heapq.heapreplace(heap, (d, index, block.step(index - first)))
            self._count += j - i + 1
            if closes < k:
                out.extend(self.close_window())
            i = j + 1
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
