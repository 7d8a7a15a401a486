"""Finished steps taken off the recorder: the part of the worker that stays in the
training process.

CUDA events are per process, so resolving them (a non-blocking ``query()``, then
placing the events on the host clock) happens here, next to the recorder. What comes
out is a :class:`Delivery` of plain data: blocks of finished steps (processing/blocks.py),
loose scalar values and the recorder's counters. The
worker reads deliveries from a source: this one, in the same process, or the sidecar's
copy of it in another process (otel_train/sidecar/).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

from ..recording import capture
from ..recording.device import DeviceClock, EventPool, on_device
from ..recording.layouts import P_EV0, P_EV1, P_SEQ, P_T0, P_T1, Step
from ..recording.notes import SummaryNotes
from ..recording.recorder import Recorder
from .blocks import Shape, StepBlock, group_steps
from .resolved import scalar_value, settle

_BY_SEQ = operator.itemgetter(P_SEQ)

# What a source hands on: a block (of recognised steps, columns not yet derived when it
# crosses to the sidecar) or resolved steps; :func:`finished` makes blocks of both.
Part = list[Step] | StepBlock


@dataclass(slots=True)
class Counters:
    """The recorder's state that metrics report, read when a delivery is taken."""

    pending: int = 0
    dropped_steps: int = 0
    dropped_phases: int = 0
    dropped_scalars: int = 0
    memory_total: int | None = None
    device_id: str | None = None  # the device's hw.id (memory.py)
    dropped_handover: int = 0  # steps the sidecar's pipe could not take (handover/feeder.py)
    # The training process's memory, as the feeder's thread last read it (handover/feeder.py)
    rss_bytes: int | None = None
    peak_rss_bytes: int | None = None
    notes: tuple[str, ...] = ()  # the run summary's lines from the adapters (recording/notes.py)


@dataclass(slots=True)
class Delivery:
    """Steps finished since the last delivery, in order, with what goes beside them:
    ``parts`` are :class:`StepBlock` objects once :func:`finished` has made them."""

    parts: list[Any] = field(default_factory=list)
    scalars: list[tuple[str, float]] = field(default_factory=list)  # recorded outside steps
    counters: Counters = field(default_factory=Counters)
    # Remote phases' trees (links.py), resolved like steps (index -1); set by finished()
    remote: list[Step] = field(default_factory=list)

    def step_count(self) -> int:
        """Finished steps in its parts (blocks and lists of steps)."""
        return sum(p.k if isinstance(p, StepBlock) else len(p) for p in self.parts)


class StepSource:
    """Takes finished steps off a :class:`Recorder` (any thread; the recorder locks)."""

    def __init__(self, recorder: Recorder, notes: SummaryNotes | None = None) -> None:
        self.recorder = recorder
        self.notes = notes if notes is not None else SummaryNotes()
        self.shed_steps = 0  # (the sidecar's source counts some at the end: replica.py)
        self.clock = DeviceClock(recorder.events)
        self.shapes: dict[Any, Shape] = {}

    def take(self, derive: bool = True, keep_partial: bool = False) -> Delivery:
        """Every step whose events have completed; ``derive``: make the parts blocks with
        their columns here (else the sidecar does, in its own process: resolved steps and
        blocks go as they are); ``keep_partial``: see :meth:`Recorder.drain_blocks`."""
        rec = self.recorder
        delivery = Delivery()
        parts = delivery.parts
        for before, run in rec.drain_blocks(True) if keep_partial else rec.drain_blocks():
            if before:
                parts.append([self._resolve(s) for s in before])
            parts.append(StepBlock.of_run(run))
        with on_device(rec.events.device):  # (this thread's queries: no context of its own)
            tail = self._take_resolved(keep_partial)
            delivery.scalars = self._loose_scalars()
        if tail:
            parts.append(tail)
        if derive:
            delivery.parts = [
                b for part in parts for b in finished(part, self.shapes, delivery.remote)
            ]
        mem = rec.memory
        delivery.counters = Counters(
            pending=rec.pending_count,
            dropped_steps=rec.dropped_steps,
            dropped_phases=rec.dropped_phases,
            dropped_scalars=rec.dropped_scalars,
            memory_total=mem.total_bytes if mem is not None else None,
            device_id=mem.device_id if mem is not None else None,
            notes=self.notes.lines,
        )
        return delivery

    def has_work(self) -> bool:
        return self.recorder.has_work()

    def backlog_due(self) -> bool:
        return self.recorder.backlog_due()

    def disable(self) -> None:
        self.recorder.enabled = False

    def _take_resolved(self, keep_partial: bool) -> list[Step]:
        """Finished steps in order, up to the first whose events have not completed.

        A step is taken off the queue before it is looked at: the training thread may
        drop the oldest step of a full queue at any time (machine._queue), and a step
        checked at the head and popped after could be one it just recycled."""
        # (``pending`` applies the log first: a partial step kept there must stay)
        rec = self.recorder
        # (stamped boundaries are replayed here one by one: no partial step kept)
        pending = rec.finished if keep_partial and not rec.stamping else rec.pending
        out: list[Step] = []
        while True:
            try:
                step = pending.popleft()
            except IndexError:
                break
            rec.note_progress(step.t1)  # (progress_ns: the queue no longer shows it)
            if not rec.steps_hold_events:
                out.append(self._resolve(step))  # host times only: nothing to query
                continue
            with capture.polling() as ok:
                if ok and _completed(step):
                    out.append(self._resolve(step))
                    continue
            pending.appendleft(step)  # (the oldest still: nothing older was queued since)
            break
        return out

    def _resolve(self, step: Step) -> Step:
        """A finished step, resolved where it stands (resolved.py): its rows in seq
        order, its CUDA events placed on the host clock, its scalars read."""
        phases = step.phases
        phases.sort(key=_BY_SEQ)
        events = self.recorder.events
        if step.scalars:
            step.scalars = _values(step.scalars, events)
        if step.ev0 is None and not any(p[P_EV0] is not None for p in phases):
            return settle(step)  # host times only (the common CPU case): the rows stand
        timed: list[tuple[Any, int, Any, int]] = []
        if step.ev0 is not None:
            timed.append((step.ev0, step.t0, step.ev1, step.t1))
        timed += [(p[P_EV0], p[P_T0], p[P_EV1], p[P_T1]) for p in phases if p[P_EV0] is not None]
        placed = iter(self.clock.place(timed))
        device = next(placed) if step.ev0 is not None else None
        rows: list[tuple[Any, ...]] = []
        for seq, parent, name, t0, t1, ev0, _ev1, memory, error, _host_s in phases:
            if ev0 is None:
                rows.append((seq, parent, name, t0, t1, None, None, memory, error,
                             (t1 - t0) / 1e9 if t1 > t0 else 0.0))  # fmt: skip
            else:
                d0, d1 = next(placed)
                rows.append((seq, parent, name, t0, t1, d0, d1, memory, error,
                             (d1 - d0) / 1e9 if d1 > d0 else 0.0))  # fmt: skip
            if error is not None:
                step.error = True
        step.phases = rows
        settle(step, device)
        clock = self.clock
        for ev0, _, ev1, _ in timed:
            events.release(ev0)
            events.release(ev1)
        for ev in clock.retired():
            events.release(ev)
        return step

    def _loose_scalars(self) -> list[tuple[str, float]]:
        """Scalars recorded outside any step whose values are known (device copies done)."""
        loose = self.recorder.loose_scalars
        if not loose:
            return []
        keep = []
        values = []
        with capture.polling() as ok:
            while loose:
                name, raw = loose.popleft()
                if isinstance(raw, tuple) and not (ok and raw[1].query()):
                    keep.append((name, raw))
                    continue
                v = scalar_value(raw, self.recorder.events)
                if v is not None:
                    values.append((name, v))
        loose.extend(keep)
        return values


def finished(part: Part, shapes: dict[Any, Shape], remote: list[Step]) -> list[StepBlock]:
    """A part as the worker takes it: blocks with their columns derived (resolved steps
    grouped by shape, ``shapes`` being the caller's cache); remote phases' trees, which
    are no steps, go to ``remote``."""
    if not isinstance(part, StepBlock):
        if any(s.index < 0 for s in part):
            remote.extend(s for s in part if s.index < 0)
            part = [s for s in part if s.index >= 0]
        return group_steps(part, shapes)
    part.columns()
    return [part]


def _completed(step: Step) -> bool:
    """Whether every event of ``step`` has completed: its own, its phases' (start events
    too: a start recorded on another stream may not have run yet) and its CUDA scalars'."""
    if step.ev1 is not None and not (step.ev1.query() and step.ev0.query()):
        return False
    for p in step.phases:
        if p[P_EV0] is not None and not (p[P_EV1].query() and p[P_EV0].query()):
            return False
    return all(raw[1].query() for _, raw in step.scalars or () if raw.__class__ is tuple)


def _values(scalars: list[tuple[str, Any]], events: EventPool) -> list[tuple[str, float]]:
    return [(n, v) for n, raw in scalars if (v := scalar_value(raw, events)) is not None]
