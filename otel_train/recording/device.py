"""CUDA events and the device clock, resolved without host-device synchronisation.

The training thread only calls :meth:`EventPool.record` (``cudaEventRecord``, an
asynchronous enqueue). The worker thread later polls ``Event.query()`` and, once an
event has completed, places it on the host clock with :class:`DeviceClock`.

How device timestamps are placed on the host clock
--------------------------------------------------
CUDA gives exact device intervals between events (``elapsed_time``) but no host
time for an event. We keep one *anchor* event and estimate
``t(ev) = anchor_host + elapsed(anchor, ev)``. Work cannot run before the host
enqueued it, so every event's host record time is a lower bound of its device time;
whenever an estimate falls below that bound the anchor is moved later by the
difference. The estimate is therefore early by exactly the smallest queueing delay
(record-to-execution latency) seen since the anchor was taken: a few microseconds
whenever the GPU drains at least once (any ``.item()``, data wait or log step),
larger only while the host runs continuously ahead of the device. The anchor is
renewed every ``reanchor_ns`` to bound drift between the GPU and host clocks.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import torch


class EventPool:
    """Reusable timing events; creation is not free, recording one is an async enqueue."""

    __slots__ = ("_free", "created")

    def __init__(self) -> None:
        self._free: collections.deque[Any] = collections.deque()
        self.created = 0

    def record(self) -> Any:
        try:
            ev = self._free.pop()
        except IndexError:
            ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self.created += 1
        ev.record()
        return ev

    def release(self, ev: Any) -> None:
        if ev is not None:
            self._free.append(ev)


class DeviceClock:
    """Places completed CUDA events on the host ``perf_counter_ns`` clock (see module doc)."""

    def __init__(self, pool: EventPool, reanchor_ns: int = 30_000_000_000) -> None:
        self._pool = pool
        self._anchor: Any = None
        self._anchor_host = 0
        self._anchor_taken = 0
        self._reanchor_ns = reanchor_ns

    def place(self, events: list[tuple[Any, int]]) -> list[int]:
        """Host-clock ns for each completed ``(event, host_record_ns)`` (same order)."""
        if not events:
            return []
        if self._anchor is None:
            self._take_anchor(*events[0])
        anchor = self._anchor
        offsets = [int(anchor.elapsed_time(ev) * 1_000_000) for ev, _ in events]
        # Lower-bound correction: device time of an event >= its host record time.
        base = self._anchor_host
        lift = max(host - (base + off) for (_, host), off in zip(events, offsets, strict=True))
        if lift > 0:
            self._anchor_host += lift
        placed = [self._anchor_host + off for off in offsets]
        last_ev, last_host = events[-1]
        if last_host - self._anchor_taken > self._reanchor_ns:
            self._take_anchor(last_ev, last_host)
        return placed

    def _take_anchor(self, ev: Any, host_ns: int) -> None:
        # The anchor is an event of a resolved step; the worker must not recycle it
        # while it anchors (see ``is_anchor``).
        if self._anchor is not None:
            self._pool.release(self._anchor)
        self._anchor = ev
        self._anchor_host = host_ns
        self._anchor_taken = host_ns

    def is_anchor(self, ev: Any) -> bool:
        return ev is self._anchor


def now_offset_ns() -> int:
    """Add to ``perf_counter_ns()`` to get Unix-epoch ns."""
    return time.time_ns() - time.perf_counter_ns()
