"""A GPU job's boundary events resolved where they can be: in the training process.

(The feeder's thread, under the recorder's lock.) In a stamped raw session (raw.py) the
hooks write slots into the ring and each boundary's stamp (its pooled CUDA event, its
allocator sample: recording/stamps.py) into the ring's stamps table. CUDA events belong
to this process, so before the sidecar may apply a slot its event is resolved here, in
ring order: ``query()`` (never waits), then its device time as host-clock ns. What
crosses is ``(ns, sample, on_device)`` per slot, which the sidecar's replica stands up as
a :class:`~otel_train.recording.device.ResolvedEvent`.

The times form one chain: the first event is placed at its slot's host time, and each
next one at the last one's plus ``elapsed_time`` between the two. So any two of them
differ by the device's elapsed time between them (durations are exact, whatever the
distance between events), and the sidecar's clock (device.DeviceClock) places the chain
on the host clock as it places events here, moving it later where an event would come
before its own record time. The chain holds its last event as one more holder of the
pool (``share``), so the pool never hands it out again while it is needed.
"""

from __future__ import annotations

from typing import Any

from ..recording import capture
from ..recording.device import EventPool, on_device
from ..recording.ring import Ring

# A resolved stamp as it crosses: (device ns on the host clock, or None for a slot timed
# on the host (no event: a capture), allocator sample, whether the hook ran on the device).
Resolved = tuple[float | None, Any, bool]


class EventTimes:
    """The stamps of a ring resolved in order, from :attr:`upto` on."""

    def __init__(self, ring: Ring, pool: EventPool) -> None:
        self._ring = ring
        self._pool = pool
        self.upto = 0  # ring position up to which every stamp is resolved
        self._last: Any = None  # the chain's last event (held: pool.share) and its time
        self._last_ns = 0.0

    def begin(self, position: int) -> None:
        """A session's slots begin at ``position``."""
        self.upto = position

    def resolve(self, end: int) -> list[Resolved | None]:
        """The stamps of the slots from :attr:`upto` towards ``end`` whose events have
        completed, in order, up to the first that has not (or whose stamp is not in the
        table yet: the hook puts it there just after its slot); :attr:`upto` moves past
        them. None: a slot with no stamp (no time: counts)."""
        out: list[Resolved | None] = []
        ring = self._ring
        pos = self.upto
        with capture.polling() as ok, on_device(self._pool.device):
            while pos < end:
                stamp = ring.stamp_at(pos)
                if stamp is None:
                    if self._wants_stamp(pos):
                        break
                    out.append(None)
                    pos += 1
                    continue
                ev, sample, on = stamp
                if ev is None:
                    out.append((None, sample, on))
                elif not ok or not ev.query():
                    break
                else:
                    out.append((self._place(ev, pos), sample, on))
                pos += 1
        self.upto = pos
        return out

    def _wants_stamp(self, pos: int) -> bool:
        """Whether the slot at ``pos`` takes a stamp (it has a time) that is not there yet."""
        return self._ring.time_at(pos) != 0

    def _place(self, ev: Any, pos: int) -> float:
        last = self._last
        if last is None:  # the chain's first: at its entry's host time (a lower bound)
            ns = float(self._ring.time_at(pos) or 0)
        else:
            ns = self._last_ns + last.elapsed_time(ev) * 1e6
        self._pool.share(ev)
        if last is not None:
            self._pool.release(last)
        self._last, self._last_ns = ev, ns
        return ns
