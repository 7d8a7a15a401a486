"""Raw handover: the log goes to the sidecar unapplied, through the shared-memory ring.

Applying the log (the step state machine, recognising step shapes) costs the training
thread ~70 us per pump on cold caches, whatever the number of steps in it; copying and
pickling it for the pipe cost most of a pump's lumps (benchmarks/README.md, "Pump
lumps"). In a raw session the hooks write their boundaries as fixed slots into the ring
(recording/ring.py), which the sidecar maps: nothing is taken or pickled on the training
thread. With the C writer the ring's header says how far it is written, and the sidecar
(sidecar/replica.py) reads it there and publishes its acknowledgements there (the
*shared* mode); the feeder's thread only tells it the codes, stacks and side entries it
has not seen. With the Python writer, whose stores carry no ordering a reader on
another core could rely on, the feeder's thread tells the position too, and the
acknowledgements come back as messages.

A GPU job's session (the device timed: *stamped*) goes the same way, its boundaries'
stamps (a pooled CUDA event and an allocator sample each: recording/stamps.py) taken by
the writer into a table beside the ring. Events are this process's: the feeder's thread
resolves them in ring order (event_times.py) and tells the sidecar, in messages, how far
they are resolved, with each slot's device time. A stamp's event goes back to the pool
once the sidecar acknowledged its slot; until then a catch-up replays it here.

The training process's own state machine lags; the ring keeps what was written since
the last point the sidecar found its replica idle (no open step, no open phase), so
that anything that needs the state here (an adapter asking for the open step, an
exception, the FLOP probe, shutdown) has the recorder catch up first: it tells the
sidecar everything written (a stamped session: as far as its events are resolved),
decodes the slots from that idle point, replays them locally, drops the steps they
finish up to what the sidecar was told (it has them) and continues with its own
state, handing on finished steps again (the parts mode). A ring the sidecar fell a whole
ring behind on refuses the next write, and the recorder catches up the same way. Raw
mode starts again at the next point where the local recorder is idle, once the sidecar
has applied the last session's end (it says so in the ring's header): a session begun
before then wrote over slots it had not read, and they were lost uncounted.

Positions are the ring's (slots written since it was made); the sidecar's idle points
``(session, position, next_index, step-stack token)`` let go of the slots before them.
"""

from __future__ import annotations

from typing import Any

from ..recording.recorder import Recorder
from ..recording.ring import Ring, decode, read_ack, with_stamps
from ..recording.scopes import INT64_MAX, NEAR_WINDOW
from . import wire
from .event_times import EventTimes

ANNOUNCE_SLOTS = 1 << 12  # slots after which the Python writer asks for a hand-over
CATCH_UP_SLOTS = 1 << 12  # slots decoded and replayed at a time by a catch-up
# Pumps let pass before the next session after one ended: doubling from FIRST_WAIT while
# sessions end soon after they begin (the state is asked for often), back to FIRST_WAIT
# once one carried SETTLED_SLOTS, ~150 steps of a plain loop (it was worth it: a loop
# that flushes every few hundred steps stays raw between its flushes).
FIRST_WAIT, MAX_WAIT = 8, 4096
SETTLED_SLOTS = 1 << 10
# A session needs this many steps before a debugging window's first (its boundaries are
# applied on the training thread): one slot begins at most one step, so it ends that
# many slots short of the window's first step less NEAR_WINDOW (recorder.ring_due).
RAW_ROOM = 1 << 10


class RawHandover:
    def __init__(self, recorder: Recorder, send: Any, ring: Ring, gone: Any) -> None:
        """``send(message)``: to the sidecar; ``gone()``: whether it died (then what
        the ring held is handed on as finished steps, dropped and counted there)."""
        self.rec = recorder
        self._send = send
        self._gone = gone
        self.ring = ring
        # Whether the sidecar reads how far the ring is written off its header, and
        # publishes its acknowledgements there (the C writer's atomics order them), or is
        # told both ways in messages (the Python writer).
        self.shared = ring.native
        # A GPU job's session (the device timed): each slot has its boundary's stamp in
        # the ring's table, resolved here before the sidecar is told of the slot
        # (event_times.py), so such a session is told by messages, from this process.
        self.stamped = False
        self.times = EventTimes(ring, recorder.events)
        self._released = 0  # ring position before which the table's events are let go of
        self.raw = False
        # While leave_raw() replays the ring here: the steps that finishes the sidecar's
        # replica has; a pump on another thread waits (the feeder's) rather than take them.
        self.catching_up = False
        self.session = 0
        self._acked = 0  # ring position the sidecar's replica was last idle at
        self._told = 0  # ring position the sidecar was told of
        # Positions of the side entries it was told of: the training thread writes an
        # entry's slot first and puts the entry beside the ring after, so one may arrive
        # after a hand-over told the position past it (sent then, whatever the position).
        self._sides_told: set[int] = set()
        self._sent = (0, 1, 0)  # boundaries, names and stacks of ring.tables it has
        self._idle: tuple[int, Any] = (0, None)  # (next step index, step stack) there
        self.caught_up = 0  # slots replayed here to catch up (a figure for tests)
        self.left = 0  # raw sessions ended by a catch-up
        self._wait = 0  # try_enter calls to let pass before the next session
        self._backoff = FIRST_WAIT
        self._began = 0  # ring position the session began at
        self.ends_at = INT64_MAX  # ring position the session ends at (a window ahead)

    def try_enter(self) -> None:
        """Start a raw session if the recorder is idle with nothing waiting (lock held)."""
        if self._wait > 0:
            self._wait -= 1  # (state asked for often: raw sessions would end at once)
            return
        rec = self.rec
        # (RAW_ROOM: a debugging window near is the log's bound)
        if self.raw or not rec.idle_for_handover(RAW_ROOM, ANNOUNCE_SLOTS):
            return
        if self.session and read_ack(self.ring.view)[:2] != (self.session, wire.SESSION_APPLIED):
            # The sidecar has not applied the last session's end yet: it would read this
            # session's slots as that one's, or find its unread slots written over.
            return
        stack = rec.step_stack
        self.raw = True
        self.session += 1
        ring, writer = self.ring, self.ring.writer
        self.stamped = rec.stamping
        self.shared = ring.native and not self.stamped
        writer.acked = self._acked = self._told = self._began = self._released = writer.pos
        room = rec.window_room
        self.ends_at = writer.pos + room - NEAR_WINDOW if room < INT64_MAX else INT64_MAX
        # (the Python writer's hand-overs: a pump every ANNOUNCE_SLOTS; a stamped session's
        # are the feeder's thread's, which resolves them)
        told_by_pumps = not self.shared and not self.stamped
        writer.due = min(self.ends_at, writer.pos + ANNOUNCE_SLOTS if told_by_pumps else 1 << 62)
        if self.stamped:
            ring.stamp_with(rec.stamper())
            self.times.begin(writer.pos)
        writer.open = 1
        rec.log_into(ring)  # (a partial step's entries, kept for the next pump: slots first)
        rec.route_to(ring)  # the hooks call the writer directly
        self._idle = (rec.next_index, stack)
        token = ring.tables.token_of(stack) if stack is not None else None
        device = rec.device if self.stamped else None
        self._send((wire.RAW_BEGIN, self.session, rec.next_index, token, self._acked,
                    self._news(), self.shared, device))  # fmt: skip

    def _news(self) -> tuple[list[Any], list[Any], list[Any]]:
        """What the sidecar does not know yet of the codes and tokens."""
        t = self.ring.tables
        b, n, s = self._sent
        news = (t.boundaries[b:], t.names[n:], t.stacks[s:])
        self._sent = (len(t.boundaries), len(t.names), len(t.stacks))
        return news

    def take(self) -> tuple[Any, ...] | None:
        """What the sidecar needs to read the ring that it was not told yet (lock held):
        the side entries and codes, and in message mode how far the ring is written (a
        shared ring's header says that itself: ``shared``); None when nothing is new."""
        rec = self.rec
        # Entries another thread logged the old way as the session opened (its call read
        # "no ring" just before): into the ring, after what was written since, for the
        # sidecar to apply. If the ring refused one, the session ends, and leave_raw()
        # applies what is left of the log here first.
        if not rec.log_into(self.ring):
            self.leave_raw()
            return None
        writer = self.ring.writer
        rec.note_progress(writer.last_t)  # (the hang watch's progress)
        if self.shared:
            self._let_go(read_ack(self.ring.view)[1])
            if not self.has_news():
                return None
        elif not self.stamped:
            writer.due = min(self.ends_at, writer.pos + ANNOUNCE_SLOTS)
        return self._announce()

    def has_news(self) -> bool:
        """Whether side entries or codes wait to be told, or old-way entries to be put in
        the ring (a shared ring's pumps)."""
        t, (b, n, s), sides = self.ring.tables, self._sent, self.ring.sides
        return (
            self.rec.log_length() > 0
            or len(t.boundaries) > b
            or len(t.names) > n
            or len(t.stacks) > s
            or bool(sides and not self._sides_told.issuperset(sides))
        )

    def _announce(self) -> tuple[Any, ...] | None:
        """``(session, position, news, sides, stamps)``: the ring is written up to
        ``position``; ``stamps``, a stamped session's, the resolved stamps of the slots
        from the position told before (event_times.py); None when nothing is new."""
        writer = self.ring.writer
        pos = writer.pos  # (first: whatever a slot before it names is in the tables now)
        stamps: list[Any] = []
        if self.stamped:  # (told only as far as the events are resolved)
            stamps = self.times.resolve(pos)
            pos = self.times.upto
        news = self._news()
        sides = self._fresh_sides()
        if pos == self._told and not any(news) and not sides:
            return None
        self._told = pos
        return (self.session, pos, news, sides, stamps)

    def _fresh_sides(self) -> list[tuple[int, tuple[Any, ...]]]:
        """The side entries not told yet. The training thread adds to the dict while this
        reads it: a copy first (one C call, whole under the GIL)."""
        told = self._sides_told
        fresh = [(p, e) for p, e in self.ring.sides.copy().items() if p not in told]
        told.update(p for p, _ in fresh)
        return fresh

    def acked(self) -> int:
        """The ring position the sidecar acknowledged last (its header, when shared)."""
        if self.shared:
            session, pos, _, _ = read_ack(self.ring.view)
            return max(self._acked, pos) if session == self.session else self._acked
        return self._acked

    def _let_go(self, acked: int) -> None:
        """The side entries and stamps before ``acked``: the sidecar has applied them."""
        if self.stamped:  # (their events back to the pool: resolved and told)
            ring, release = self.ring, self.rec.events.release
            for p in range(self._released, acked):
                stamp = ring.take_stamp_at(p)
                if stamp is not None:
                    release(stamp[0])
            self._released = max(self._released, acked)
        sides, told = self.ring.sides, self._sides_told
        if sides and next(iter(sides)) < acked:
            for p in [p for p in sides.copy() if p < acked]:  # (a copy: as _fresh_sides)
                del sides[p]
                told.discard(p)

    def on_idle(self, session: int, position: int, next_index: int, token: Any) -> None:
        """The sidecar's replica was idle at ``position`` (lock held)."""
        if session != self.session or not self.raw or position <= self._acked:
            return
        stacks = self.ring.tables.stack_objects
        if token is not None and token not in stacks:
            return  # a stack this process did not name: keep the slots (catch up from before)
        acked = min(position, self.ring.writer.pos)
        self._let_go(acked)  # (first: the writer stamps the slots past a ring from then on)
        self._acked = self.ring.writer.acked = acked
        self._idle = (next_index, stacks.get(token) if token is not None else None)

    def leave_raw(self) -> None:
        """Bring the local state machine up to what was written (recorder lock held)."""
        if not self.raw:
            return
        self.catching_up = True  # (first: a pump that reads raw False sees it)
        self.raw = False
        try:
            self._catch_up()
        finally:
            self.catching_up = False
        self._send((wire.RAW_END, self.session))

    def _catch_up(self) -> None:
        """leave_raw()'s replay of what went out raw; the steps it finishes released."""
        self.left += 1
        rec, ring = self.rec, self.ring
        writer = ring.writer
        if writer.pos - self._began >= SETTLED_SLOTS:
            self._backoff = FIRST_WAIT
        self._wait = self._backoff
        self._backoff = min(MAX_WAIT, self._backoff * 2)
        # Entries logged the old way by calls in flight when the session began: older
        # than the slots. (Taken before the ring closes: what is logged after that is
        # newer, and the caller applies it after these.)
        early = rec.take_log()
        self.detach()
        # Everything written is told first: the sidecar applies all of it (a shared
        # ring's header may have shown it any of it already), and so does this process.
        final = self._announce()
        if final is not None:
            self._send((wire.RING, *final))
        if self.shared:
            self._acked_from_header()
        rec.idle_at(*self._idle)
        loose = len(rec.loose_scalars)
        # The sidecar's replica counts what these entries drop: do not count it twice.
        dropped = rec.dropped_steps, rec.dropped_phases
        gone = self._gone()
        rec.apply_entries(early)
        # What the sidecar was told of, its steps released here (its replica has them),
        # then what it was not (a stamped session's slots not resolved yet): kept here.
        for start, end in self._pieces(self._acked, self._told):
            rec.apply_entries(self._entries(start, end))
            rec.release_finished(gone)
        rec.dropped_steps, rec.dropped_phases = dropped
        while len(rec.loose_scalars) > loose:
            rec.loose_scalars.pop()
        for start, end in self._pieces(self._told, writer.pos):
            rec.apply_entries(self._entries(start, end))
        ring.sides.clear()
        self._sides_told.clear()

    def _pieces(self, start: int, end: int) -> list[tuple[int, int]]:
        """Ring positions ``start`` to ``end`` in pieces of at most CATCH_UP_SLOTS (a
        ring's worth is thousands of steps)."""
        return [(p, min(end, p + CATCH_UP_SLOTS)) for p in range(start, end, CATCH_UP_SLOTS)]

    def _entries(self, start: int, end: int) -> list[tuple[Any, ...]]:
        """The log entries of slots ``start`` to ``end``, a stamped session's with their
        stamps (the table's no more: the entries' replay takes their events)."""
        ring = self.ring
        tables = ring.tables
        entries = decode(ring.view, ring.capacity, start, end, tables, tables.stack_objects.get,
                         ring.sides)[0]  # fmt: skip
        self.caught_up += end - start
        return with_stamps(entries, start, ring.take_stamp_at) if self.stamped else entries

    def detach(self) -> None:
        """The hooks write no more to the ring: a write in flight now is refused and goes
        to the log, and the recorder's own ``transition`` methods are back."""
        self.ring.writer.open = 0
        self.rec.route_to(None)
        if self.stamped:
            self.ring.stamp_with(None)

    def _acked_from_header(self) -> None:
        """A shared ring's last acknowledgement, as the sidecar published it."""
        session, pos, next_index, token = read_ack(self.ring.view)
        stacks = self.ring.tables.stack_objects
        if session != self.session or pos <= self._acked or (token and token not in stacks):
            return
        self._acked = min(pos, self.ring.writer.pos)
        self._idle = (next_index, stacks.get(token) if token else None)
