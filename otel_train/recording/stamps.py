"""What a boundary of a GPU job must take at the boundary itself, and nothing more.

A CUDA event has to be recorded, and the allocator's peak read, when the training
thread passes a boundary; everything else (which step, which phases, what they hold)
can wait. So once the device is timed the hooks still only log: each logged entry
carries a *stamp* taken at the hook (:data:`Stamp`; in one C call where _stamp.c
builds) as its last element (:class:`StampedLog`), or in a raw session its slot has one
in the ring's stamps table (ring.py), and the step machine replays the entries later,
using the stamp wherever the immediate path would record an event or read the
allocator (:class:`BoundaryStamps`): on the worker (``sidecar="off"``), or in the
sidecar's replica with the events resolved in this process first
(handover/event_times.py; there a :class:`~.device.ResolvedEvent` stands for each).

One event per boundary: the phase that ends there and the phase (or step) that begins
there share it, so an event may be held by several rows. The pool counts its holders
(:meth:`EventPool.share`, device.py) and takes it back after the last one lets go.
A boundary whose event no row took is released as its entry is replayed.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import capture


class PythonStampedDeque(collections.deque):  # type: ignore[type-arg]
    """_stamp.c's ``StampedDeque`` in Python (the reference, and the fallback where that
    is not built): ``append`` adds ``self.take_stamp()`` to an entry with a time."""

    take_stamp: Callable[[], Any]

    def append(self, item: tuple[Any, ...]) -> None:
        collections.deque.append(self, (*item, self.take_stamp() if item[1] else None))


try:  # the stamp and the stamped append in one C call each (_stamp.c)
    from ._stamp import StampedDeque
    from ._stamp import Stamper as NativeStamper
except ImportError:  # (not built: take_stamp and PythonStampedDeque, the same in Python)
    NativeStamper = None
    StampedDeque = PythonStampedDeque

if TYPE_CHECKING:
    import torch  # (the training process's recorder binds it: machine._import_torch)

    from .device import EventPool
    from .memory import CudaMemoryTracker, MemorySample

# A stamp: the boundary's event (None while a CUDA graph is captured), its allocator
# sample (None: memory off), and whether the hook's thread ran on the bound device (a
# background tree of a thread on another device is host-timed: machine._thread_device).
Stamp = tuple[Any, "MemorySample | None", bool]
UNSTAMPED: Stamp = (None, None, False)  # logged before stamps began: host time only


def import_torch() -> None:
    global torch
    import torch


class StampedLog(StampedDeque):  # type: ignore[misc]
    """The deferred log of a process whose device is timed: ``append`` (C, or
    :class:`PythonStampedDeque`'s) adds the stamp to an entry with a time (hooks read
    the clock; entries at time 0, counts and scalars, get none). Only the training
    process's threads append; the log is read under the recorder's lock, as the plain
    one is."""

    def __init__(self, stamp: Any, earlier: collections.deque[Any]) -> None:
        super().__init__()
        self.take_stamp = stamp
        for item in earlier:  # (logged before stamps began: host time)
            collections.deque.append(self, (*item, UNSTAMPED if item[1] else None))

    def append_stamped(self, item: tuple[Any, ...], stamp: Stamp) -> None:
        """An entry whose stamp was taken before (a boundary placed after the fact)."""
        collections.deque.append(self, (*item, stamp))


class BoundaryStamps:
    """The step machine's source of events and allocator samples: taken now (the
    immediate path, ``_stamp`` None) or read from the stamp of the entry replayed."""

    events: EventPool
    memory: CudaMemoryTracker | None
    device: int | None

    def __init__(self) -> None:
        self._stamp: Stamp | None = None
        self._stamp_used = False
        self._stamp_taker: Any = None  # the stamper the hooks use (stamper())
        self._taken = 0  # stamps take_stamp took

    def take_stamp(self) -> Stamp:
        """(The hook's thread.) This boundary's event, on the bound device's stream of
        this thread, its allocator sample, and whether this thread runs on that device."""
        self._taken += 1
        mem = self.memory
        on = torch.cuda.current_device() == self.device
        return (self.events.record(), mem.sample() if mem is not None else None, on)

    def stamper(self) -> Callable[[], Stamp]:
        """What takes the hooks' stamps: :meth:`take_stamp` in one C call (_stamp.c), or
        the method itself where that is not built or this torch lacks the allocator's
        private bindings (memory.CudaMemoryTracker.sample_calls)."""
        if self._stamp_taker is None:
            mem = self.memory
            calls = mem.sample_calls() if mem is not None else (None, None)
            if NativeStamper is None or calls is None:
                self._stamp_taker = self.take_stamp
            else:
                self._stamp_taker = NativeStamper(
                    pool=self.events, make=self.events.new_event, capture=capture,
                    stream_of=torch.cuda.current_stream, get_device=torch.cuda.current_device,
                    stats=calls[0], reset=calls[1], mem_device=None if mem is None else mem.device,
                )  # fmt: skip
        return self._stamp_taker  # type: ignore[no-any-return]

    def stamps_taken(self) -> int:
        """Stamps the hooks took (one a boundary with a time), either way."""
        return self._taken + int(getattr(self._stamp_taker, "taken", 0))

    def _replay_stamped(self, item: tuple[Any, ...]) -> None:
        """Replay a stamped entry (its stamp is its last element); the event no row took
        goes back to the pool."""
        stamp = item[-1]
        self._stamp, self._stamp_used = (stamp if stamp is not None else UNSTAMPED), False
        try:
            self._replay(item)  # type: ignore[attr-defined]
        finally:
            ev = self._stamp[0]
            if ev is not None and not self._stamp_used:
                self.events.release(ev)
            self._stamp = None

    def _boundary_event(self) -> Any:
        """The event of the boundary being applied: recorded now, or the stamp's (shared
        with the rows that took it before)."""
        stamp = self._stamp
        if stamp is None:
            return self.events.record()
        ev = stamp[0]
        if ev is not None:
            if self._stamp_used:
                self.events.share(ev)
            self._stamp_used = True
        return ev

    def _boundary_memory(self) -> MemorySample | None:
        """The allocator sample of the boundary being applied: read now, or the stamp's;
        None with memory off."""
        stamp = self._stamp
        if stamp is not None:
            return stamp[1]
        mem = self.memory
        return mem.sample() if mem is not None else None

    def _stamp_device(self) -> int | None:
        """While a stamp is replayed: the bound device if the hook's thread ran on it."""
        stamp = self._stamp
        return self.device if stamp is not None and stamp[0] is not None and stamp[2] else None
