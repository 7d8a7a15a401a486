"""The sidecar's source of finished steps: what arrives on the pipe, and a replica
recorder applying the training process's ring.

Finished steps come decoded from deliveries (the parts mode, and CUDA). In a raw session
(raw.py) the training process's hooks write slots into the shared-memory ring
(recording/ring.py) and the feeder tells how far it is written; :class:`RemoteSource`
decodes the slots into log entries and its replica recorder applies them, as the
training process's own recorder would have. It reports the last point where the replica
was idle, so that the training process can let go of the slots before it.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import mmap
import threading
import time
from typing import Any

from ..handover import wire
from ..handover.wire import replica_stacks, stack_of
from ..processing.blocks import Shape, StepBlock
from ..processing.source import Counters, Delivery, StepSource, finished
from ..recording.device import ResolvedEvent
from ..recording.recorder import Recorder
from ..recording.ring import (
    HEADER,
    SLOT,
    Tables,
    decode,
    publish_ack,
    read_drain_by,
    with_stamps,
    written,
)

MAX_RANGES = 4096  # disjoint ranges of handed-on step indices kept (the oldest forgotten)


class IndexRanges:
    """Step indices as sorted, disjoint, merged ranges (consecutive steps make one)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def has(self, first: int, last: int) -> bool:
        """Whether every index from ``first`` to ``last`` is in."""
        i = bisect.bisect_right(self.starts, first) - 1
        return i >= 0 and self.ends[i] >= last

    def add(self, first: int, last: int) -> None:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_left(starts, first)
        starts.insert(i, first)
        ends.insert(i, last)
        if i > 0 and ends[i - 1] >= first - 1:  # joins the range before
            i -= 1
            ends[i] = max(ends[i], ends[i + 1])
            del starts[i + 1], ends[i + 1]
        while i + 1 < len(starts) and starts[i + 1] <= ends[i] + 1:  # and those after
            ends[i] = max(ends[i], ends[i + 1])
            del starts[i + 1], ends[i + 1]
        if len(starts) > MAX_RANGES:
            del starts[0], ends[0]


_REPLICA = Counters()  # marks the replica's deliveries: the counters are the trainer's
REPORT_S = 0.05  # seconds between applying raw entries and reporting the idle point
# Finished steps received and not yet taken by the worker: past this many the oldest
# deliveries are dropped and counted (dropped{reason="sidecar"}), as the training process's
# feeder drops what its pipe cannot take. Each held step is ~1.5 KiB as a resolved step,
# and 16384 of them broke the collector-down memory bound.
MAX_HELD_STEPS = 1024
# Held steps (or deliveries) that make the worker take them before its next batch time:
# it looks every 50 ms, and the ring's reads bring ~500 steps of a 5k steps/s loop every
# 0.1 s, so at a quarter of the bound it takes them well before the bound drops any.
DUE_HELD_STEPS = MAX_HELD_STEPS // 4
DUE_DELIVERIES = 64
# Slots decoded at a time: a ring the sidecar fell behind on is applied in pieces, so
# that its entries never wait here all at once as objects.
DECODE_SLOTS = 1024
# Unread slots of a shared ring that make the worker take them before its next batch
# time (it looks every 50 ms): the writer refuses past a whole ring not let go of.
DUE_SLOTS = 4096


class RingTables(Tables):
    """The training process's codes and tokens as this process knows them: its stacks
    stand for replica stacks here (wire.stack_of)."""

    def learn(self, news: tuple[list[Any], list[Any], list[Any]]) -> None:
        boundaries, names, stacks = news
        self.boundaries.extend(boundaries)
        self.names.extend(names)
        for token, main in stacks:
            self.stack_objects[token] = stack_of(token, main)


class RemoteSource:
    """The worker's source here (source.py's interface): finished steps decoded from the
    pipe, and a replica recorder applying the ring's slots (raw.py)."""

    def __init__(self, settings: Any, out: Any, ring: tuple[int, int] | None = None) -> None:
        """``ring``: the shared-memory ring's descriptor and capacity, or None (no raw
        sessions then)."""
        self._deliveries: collections.deque[Delivery] = collections.deque()
        self._held = 0  # finished steps in _deliveries
        self.dropped = 0  # steps dropped for the bound (MAX_HELD_STEPS)
        self.shed_steps = 0  # steps counted, not applied, past the end's drain time
        self.counters = Counters()
        self.disabled = False
        self._out = out
        self._lock = threading.Lock()
        self.replica = Recorder(settings, replay_only=True)
        self.replica.marks_idle = True
        self._replica_source = StepSource(self.replica)
        self.session: int | None = None
        self._view: Any = None
        self._capacity = 1
        if ring is not None:
            fd, self._capacity = ring
            size = self._capacity * SLOT.size
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._view = mmap.mmap(fd, HEADER + size, flags=flags)  # (acks go in its header)
        self.shared = False  # this raw session's ring says how far it is written (raw.py)
        self.tables = RingTables()
        self._sides: dict[int, tuple[Any, ...]] = {}
        # A stamped session's (a GPU job's) resolved stamps by ring position, until their
        # slots are decoded: handover/event_times.py.
        self._stamps: dict[int, Any] = {}
        self._start = 0  # ring position of this raw session's first slot
        self._read = 0  # ring position decoded up to
        self._written = 0  # ring position the training process said it wrote up to
        self._appended = 0  # entries of this raw session appended to the replica's log
        self._reported = 0  # the last idle point of this raw session reported
        self._drained = 0.0
        # The step indices handed to the worker or dropped for the bound, and the steps
        # that came again (applied twice, in the replica and in the training process,
        # around a raw session's end): each step is counted once, processed or dropped.
        # Steps need not come in index order.
        self._handed = IndexRanges()
        self.repeated = 0
        self.shapes: dict[Any, Shape] = {}  # resolved steps' shapes (blocks.group_steps)

    def push(self, delivery: Delivery) -> None:
        with self._lock:
            if not self.disabled:
                self._hold(delivery)

    def _hold(self, delivery: Delivery, bounded: bool = True) -> None:
        """Keep a delivery for the worker, dropping the oldest past MAX_HELD_STEPS (lock
        held): a worker that falls behind (this process yields its core to training)
        must not hold an unbounded backlog. ``bounded``: False for what the worker reads
        off the ring itself (bounded by the ring, and taken at once)."""
        deliveries = self._deliveries
        deliveries.append(delivery)
        self._held += delivery.step_count()
        while bounded and self._held > MAX_HELD_STEPS and len(deliveries) > 1:
            oldest = deliveries.popleft()
            self._held -= oldest.step_count()
            for part in oldest.parts:  # (counted once: a copy that comes later is a repeat)
                part = self._unseen(part)
                if part:
                    self.dropped += part.k if isinstance(part, StepBlock) else len(part)

    def ring(
        self, session: int, position: int, news: Any, sides: list[tuple[int, Any]],
        stamps: list[Any] | None = None,
    ) -> None:  # fmt: skip
        """The ring is written up to ``position``, with these codes and side entries
        (and a stamped session's resolved stamps from the position told before): apply
        its slots."""
        with self._lock:
            if self.disabled or session != self.session:
                return
            self.tables.learn(news)
            self._sides.update(sides)
            if stamps:
                first = self._written
                self._stamps.update(
                    (p, _stamp(r)) for p, r in enumerate(stamps, first) if r is not None
                )
            self._written = max(self._written, position)
            self._advance(taking=False)

    def _advance(self, taking: bool = True) -> None:
        """Apply the slots written past what was read, in pieces (lock held). The
        training process keeps its slots since the last idle point this reports: apply
        and report every REPORT_S at least (not per message: this process's CPU is the
        training node's too). Not ``taking`` (a message said more was written): read no
        further once a quarter of the held steps' bound waits, the rest stays in the ring
        for the worker, whom that makes due (a ring read whole at once would be dropped
        past the bound, and a fast loop fills a quarter of a ring between its looks)."""
        if self.shared:  # (how far it is written: the writer's header says)
            self._written = max(self._written, written(self._view)[0])
        while self._read < self._written:
            if not taking and self._held >= DUE_HELD_STEPS:
                break
            end = min(self._written, self._read + DECODE_SLOTS)
            start = self._read
            entries, self._read = decode(self._view, self._capacity, self._read, end,
                                         self.tables, self.tables.stack_objects.get,
                                         self._sides)  # fmt: skip
            if self.replica.device_timed:
                entries = with_stamps(entries, start, self._stamp_of)
            self.replica.log_entries(entries)
            self._appended += len(entries)
            if self._read < end:
                break  # (a side entry or a code not here yet: the next message has it)
            if self._read < self._written:
                self._apply(bounded=not taking)
        if time.monotonic() - self._drained >= REPORT_S:
            self._apply(bounded=not taking)

    def _apply(self, bounded: bool = True) -> None:
        self._drained = time.monotonic()
        self._hold(self._replica_take(keep_partial=True), bounded)
        self._report_idle()

    def _replica_take(self, keep_partial: bool) -> Delivery:
        if self.past_drain():  # out of time at the end: count the steps, apply nothing
            self.shed_steps += self.replica.discard_log()
            return Delivery(counters=_REPLICA)
        delivery = self._replica_source.take(derive=False, keep_partial=keep_partial)
        delivery.counters = _REPLICA  # the replica's own are added in take()
        return delivery

    def _stamp_of(self, position: int) -> Any:
        """The resolved stamp of the slot at ``position``, taken (None: none came)."""
        return self._stamps.pop(position, None)

    def raw_begin(self, session: int, next_index: int, token: Any, position: int,
                  news: Any, shared: bool, device: int | None = None) -> None:  # fmt: skip
        """A raw session from ring position ``position``; ``shared``: the ring's header
        says how far it is written and takes the acknowledgements (raw.py); ``device``:
        a stamped session's (a GPU job's) device, its slots' stamps come with the RING
        messages."""
        with self._lock:
            if device is not None:
                self.replica.time_resolved(device)
            self.shared = shared and self._view is not None
            self.tables.learn(news)
            stack = self.tables.stack_objects.get(token) if token is not None else None
            self.replica.idle_at(next_index, stack)  # (where the training process was)
            self.session, self._appended, self._reported = session, 0, 0
            self._start = self._read = self._written = position
            self._sides.clear()
            self._stamps.clear()

    def raw_end(self, session: int) -> None:
        """The training process caught up: keep the steps the entries finished, drop the
        step they leave open (it goes on there)."""
        with self._lock:
            if session != self.session:
                return
            self._advance()  # (to where the training process said it caught up from)
            self._hold(self._replica_take(keep_partial=False), bounded=False)
            self.replica.drop_open()
            for stack in replica_stacks().values():
                stack.clear()
            self.session = None
            if self._view is not None:  # (the training process may begin the next one)
                publish_ack(self._view, session, wire.SESSION_APPLIED, 0, 0)

    def take(self) -> Delivery:
        out = Delivery(counters=self.counters)
        with self._lock:
            if self.session is not None:
                self._advance()
                if self.replica.log_length():
                    self._apply(bounded=False)
            deliveries, self._deliveries = self._deliveries, collections.deque()
            self._held = 0
        extra = self.replica
        for delivery in deliveries:
            for part in delivery.parts:
                with self._lock:  # (_hold counts what it drops against the same ranges)
                    part = self._unseen(part)
                if part:
                    out.parts.extend(finished(part, self.shapes, out.remote))
            out.scalars.extend(delivery.scalars)
            if delivery.counters is not _REPLICA:
                self.counters = delivery.counters
        c = self.counters
        out.counters = dataclasses.replace(
            c,
            dropped_phases=c.dropped_phases + extra.dropped_phases,
            dropped_handover=c.dropped_handover + self.dropped,
        )
        return out

    def _unseen(self, part: Any) -> Any:
        """``part`` without the steps already handed on (by index); remote trees (index
        -1) always. A block not wholly handed on before is kept whole."""
        handed = self._handed
        if isinstance(part, StepBlock):
            end = part.first + part.k - 1
            if part.k and handed.has(part.first, end):
                self.repeated += part.k
                return None
            handed.add(part.first, end)
            return part
        fresh = []
        for step in part:
            if step.index >= 0:
                if handed.has(step.index, step.index):
                    self.repeated += 1
                    continue
                handed.add(step.index, step.index)
            fresh.append(step)
        return fresh

    def _report_idle(self) -> None:
        """Tell the training process the last ring position of this raw session where
        the replica was idle: it lets go of the slots before it (raw.py)."""
        rep = self.replica
        mark = rep.idle_mark
        if mark is None:
            return  # (no idle point in what was applied: the last one reported stands)
        behind, next_index, stack = mark
        rep.idle_mark = None
        position = self._start + self._appended - rep.log_length() - behind
        if position <= self._reported:
            return
        self._reported = position
        tokens = {id(v): k for k, v in self.tables.stack_objects.items()}
        token = tokens.get(id(stack)) if stack is not None else None
        if self.shared:
            assert self.session is not None
            publish_ack(self._view, self.session, position, next_index, token or 0)
        else:
            self._out((wire.IDLE, self.session, position, next_index, token))

    def finish(self) -> None:
        """The end: apply what the replica still holds, a partial last step included."""
        with self._lock:
            if self.session is not None:
                self._hold(self._replica_take(keep_partial=False))

    def past_drain(self) -> bool:
        """Whether the training process is ending and the time it gave to apply what
        is left has passed (ring.publish_drain_by): what is left is counted, not applied."""
        if self._view is None:
            return False
        drain_by = read_drain_by(self._view)
        return drain_by > 0 and time.monotonic_ns() >= drain_by

    def has_work(self) -> bool:
        # (a partial step kept in the replica's log is not work until finish())
        return bool(self._deliveries) or self._unread() > 0

    def backlog_due(self) -> bool:
        return (
            self._held >= DUE_HELD_STEPS
            or len(self._deliveries) >= DUE_DELIVERIES
            or self._unread() >= DUE_SLOTS
        )

    def _unread(self) -> int:
        """Slots of a shared ring written and not read yet (no lock: only a figure)."""
        if not self.shared or self.session is None:
            return 0
        return int(written(self._view)[0]) - self._read

    def disable(self) -> None:
        with self._lock:
            self.disabled = True
            self._deliveries.clear()
            self._held = 0


def _stamp(resolved: tuple[float | None, Any, bool]) -> tuple[Any, Any, bool]:
    """A stamp as the replica applies it: the resolved time as an event."""
    ns, sample, on = resolved
    return (ResolvedEvent(ns) if ns is not None else None, sample, on)
