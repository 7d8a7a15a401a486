"""CUDA events and the device clock, resolved without host-device synchronisation.

The training thread only calls :meth:`EventPool.record` (``cudaEventRecord``, an
asynchronous enqueue). A consumer thread later polls ``Event.query()`` and, once an
event has completed, places it on the host clock with :class:`DeviceClock`.

One device, one stream per thread
---------------------------------
A recorder is bound to one CUDA device (the model's, else the training thread's current
device at the first boundary that finds CUDA initialised: ``Recorder.device``), and its
pool records every event on that device, on the calling thread's current stream *of that
device*. So a model on ``cuda:1`` without ``torch.cuda.set_device(1)`` is timed on its
own stream, and no event of another device ever enters the pool. Threads that only read
events (the worker, the helper's feeder) do so inside :func:`on_device`, so they never
make a CUDA context on device 0 of their own.

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
Durations do not go through the anchor: each is ``elapsed_time`` between its own two
events (an offset from an old anchor is a float32 of milliseconds, ~60 us coarse after
ten minutes).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from . import capture

if TYPE_CHECKING:
    import torch  # (bound by import_torch())


def import_torch() -> None:
    """Import torch for the pool and :func:`on_device`: a recorder of the training
    process does when it is built (machine.py); a replay-only one (the sidecar's), which
    records no event and binds no device, does not, and the sidecar never imports torch."""
    global torch
    import torch


class EventPool:
    """Reusable timing events of one device; creation is not free, recording one is an
    async enqueue. ``device`` is set when the recorder binds (None: the current one)."""

    __slots__ = ("_holders", "created", "device", "free")

    def __init__(self, device: int | None = None) -> None:
        # Events ready to record again, a stack (the C stamper pops it too: _stamp.c).
        self.free: list[Any] = []
        # Holders beyond the first, by event id: a boundary's one event serves the phase
        # that ends there and what begins there (stamps.py); the anchor of a DeviceClock.
        self._holders: dict[int, int] = {}
        self.created = 0
        self.device = device

    def record(self) -> Any:
        """A recorded event, or None while a CUDA graph is being captured (an event
        recorded then would belong to the graph: the caller falls back to host time)."""
        if capture.active:
            return None
        free = self.free
        ev = free.pop() if free else self.new_event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def new_event(self) -> Any:
        """An event more (the free ones are all held)."""
        self.created += 1
        return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def share(self, ev: Any) -> None:
        """One holder more of ``ev``: it returns to the pool after every holder let go."""
        key = id(ev)
        self._holders[key] = self._holders.get(key, 0) + 1

    def release(self, ev: Any) -> None:
        if ev is None:
            return
        holders = self._holders
        if holders:
            more = holders.pop(id(ev), 0)
            if more:
                if more > 1:
                    holders[id(ev)] = more - 1
                return
        self.free.append(ev)


def on_device(index: int | None) -> contextlib.AbstractContextManager[Any]:
    """Make ``index`` the calling thread's device while it queries events (nothing when it
    already is). ``torch.cuda.device`` restores the previous device only where that device
    has a context, so a thread that never had one does not get one on device 0."""
    if index is None or torch.cuda.current_device() == index:
        return contextlib.nullcontext()
    return torch.cuda.device(index)


class DeviceClock:
    """Places completed CUDA events on the host ``perf_counter_ns`` clock (see module doc).

    The clock holds its anchor (an event of a step already resolved) as one more holder
    of the pool (``pool.share``), so the caller releases every event it placed; an
    anchor the clock lets go is handed back by :meth:`retired`, once.
    """

    def __init__(self, pool: EventPool, reanchor_ns: int = 30_000_000_000) -> None:
        self._pool = pool
        self._anchor: Any = None
        self._anchor_host = 0
        self._anchor_taken = 0
        self._reanchor_ns = reanchor_ns
        self._retired: list[Any] = []

    def place(self, spans: list[tuple[Any, int, Any, int]]) -> list[tuple[int, int]]:
        """Host-clock ns ``(start, end)`` of completed ``(ev0, host0, ev1, host1)`` pairs:
        starts from the anchor, each end its start plus the pair's own elapsed time."""
        if not spans:
            return []
        if self._anchor is None:
            self._take_anchor(spans[0][0], spans[0][1])
        anchor = self._anchor
        out = []
        lift = 0
        base = self._anchor_host
        for ev0, host0, ev1, host1 in spans:
            start = int(anchor.elapsed_time(ev0) * 1_000_000)
            length = max(0, int(ev0.elapsed_time(ev1) * 1_000_000))
            out.append((start, start + length))
            # Lower-bound correction: an event's device time >= its host record time.
            lift = max(lift, host0 - (base + start), host1 - (base + start + length))
        if lift > 0:
            self._anchor_host += lift
        base = self._anchor_host
        placed = [(base + s, base + e) for s, e in out]
        last = spans[-1]
        if last[3] - self._anchor_taken > self._reanchor_ns:
            self._retired.append(self._anchor)
            self._take_anchor(last[2], last[3])
        return placed

    def _take_anchor(self, ev: Any, host_ns: int) -> None:
        self._pool.share(ev)
        self._anchor = ev
        self._anchor_host = host_ns
        self._anchor_taken = host_ns

    def retired(self) -> list[Any]:
        """Anchors let go since the last call: the caller releases each once."""
        out, self._retired = self._retired, []
        return out


def now_offset_ns() -> int:
    """Add to ``perf_counter_ns()`` to get Unix-epoch ns."""
    return time.time_ns() - time.perf_counter_ns()


class ResolvedEvent:
    """An event another process resolved: its device time as host-clock ns (a float,
    handover/event_times.py). It answers what the step machine and the worker ask of an
    event, ``query()`` and ``elapsed_time``, as the CUDA event it stands for would: a
    difference of two is the elapsed time between the events they stand for."""

    __slots__ = ("ns",)

    def __init__(self, ns: float) -> None:
        self.ns = ns

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: ResolvedEvent) -> float:
        """Milliseconds from this event to ``end``, as ``torch.cuda.Event.elapsed_time``."""
        return (end.ns - self.ns) / 1e6


class ResolvedPool(EventPool):
    """The pool of a replica recorder (the sidecar's: sidecar/replica.py), whose events
    are :class:`ResolvedEvent` objects that come with the entries: it records none, and
    keeps none it is handed back (its holders are counted as a pool's are)."""

    __slots__ = ()

    def record(self) -> Any:
        raise RuntimeError("a replica records no event: its entries carry resolved times")

    def release(self, ev: Any) -> None:
        if ev is None:
            return
        holders = self._holders
        more = holders.pop(id(ev), 0)
        if more > 1:
            holders[id(ev)] = more - 1
