"""The deferred log: boundaries logged on the training thread, applied later under a lock.

Nothing must be read at a boundary but the clock (and, with the device timed, its event
and allocator sample: stamps.py), so a hook appends ``(stack, time, kind, ...)`` to a
log and returns; the state machine (phases.py) replays
the log under the lock on whichever thread settles it first, normally the worker. Any
caller that needs the state settles before it reads it, so the state every caller sees
is the same as if nothing had been deferred. Runs of steps whose boundaries repeat a known
shape are not replayed one by one: drain.py's layer hands them to the worker as runs.
The log may also go on unapplied (a raw hand-over: handover/raw.py) and the state be
taken back here later: the methods of "the log handed on" below.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable
from itertools import islice
from typing import TYPE_CHECKING, Any

from ..settings import Settings
from .layouts import (
    COUNTS,
    ENTER,
    ENTER_REMOTE,
    EXIT,
    LINK,
    P_T1,
    S_STEP,
    S_T0,
    SCALARS,
    STEP_BEGIN,
    STEP_END,
    Step,
    newest_time,
    step_ends,
)
from .phases import PhaseMachine
from .scopes import BACKGROUND, EXPLICIT, INT64_MAX, MAX_LOG, NEAR_WINDOW, SETTLE_SLICE
from .stamps import StampedLog

if TYPE_CHECKING:
    from .debug_hooks import DebugHooks
    from .ring import Ring, Unapplied


class DeferredLog(PhaseMachine):
    """The phase machine behind a log: entries are applied in order, by whoever needs
    the state first, and recognised steps leave it as blocks."""

    def __init__(
        self, settings: Settings, replay_only: bool = False, debug: DebugHooks | None = None
    ) -> None:
        super().__init__(settings, replay_only, debug)
        # Deferred boundaries, counts and scalars; their shapes are listed in _replay.
        self._log: collections.deque[tuple[Any, ...]] = collections.deque()
        self._lock = threading.RLock()  # the state machine runs on one thread at a time
        # Who takes the log unapplied, if anyone: anything that needs this recorder's
        # state has it catch up first.
        self.handover: Unapplied | None = None
        # Where applying the log (drain.py's drain_blocks(), or a settle) last left this
        # machine idle, when marks_idle is set (the sidecar's replica: the training
        # process lets go of what it sent up to there): (entries applied since, next step
        # index, step stack), or None if it never was.
        self.marks_idle = False
        self.idle_mark: tuple[int, int, Any] | None = None
        self._scalar_events = False  # CUDA scalars were recorded (see _device_scalars)
        # The newest entry time that left the log or the queue (progress_ns).
        self.progress_floor = 0
        # Who takes the log past how many entries (on_backlog), and whether a debugging
        # window lies ahead, so the log is handed over before one of its steps is logged.
        if debug is not None:
            debug.moved = self._decide_deferral
        self._taker: Any = self.settle
        self._take_limit = MAX_LOG
        self.window_room = INT64_MAX  # steps before a debugging component acts
        self._log_limit = MAX_LOG
        self._on_full: Any = self.settle
        self._decide_deferral()
        # The shared-memory ring the hooks write to instead of the log, while a raw
        # hand-over has one open (ring.py, handover/raw.py); None otherwise.
        self._ring: Ring | None = None

    # -- what turns deferral off -------------------------------------------------------

    @property
    def debug(self) -> DebugHooks | None:
        return self._debug

    @debug.setter
    def debug(self, hooks: DebugHooks | None) -> None:
        # Debugging components act at step boundaries on the training thread (a profiler
        # starts there, a snapshot window opens there): no deferral near their steps.
        with self._lock:
            self._settle()
            self._debug = hooks
            if hooks is not None:
                hooks.moved = self._decide_deferral
            self._decide_deferral()

    @property
    def flop_probe(self) -> Any:
        return self._flop_probe

    @flop_probe.setter
    def flop_probe(self, probe: Any) -> None:
        # A counted step runs under a dispatch mode entered and left on the training
        # thread at the step's boundaries: no deferral while a count is due.
        with self._lock:
            self._settle()
            self._flop_probe = probe
            self._decide_deferral()

    def _device_scalars(self) -> None:
        """A CUDA tensor was recorded: its value arrives by an event only this process can
        query; with the device not timed, the log and the raw hand-over (which cross to
        the sidecar unresolved) stop."""
        with self._lock:
            self._settle()
            self._scalar_events = True
            self._decide_deferral()

    @property
    def stamping(self) -> bool:
        """Whether hooks log with stamps (the device timed): a raw session's slots then
        take them too, and their events are resolved here before the slots are told
        (handover/event_times.py)."""
        return self._defer and self._cuda

    def note_progress(self, t: int) -> None:
        """Entries or steps up to ``t`` left the log or the queue (progress_ns)."""
        if t > self.progress_floor:
            self.progress_floor = t

    def _decide_deferral(self) -> None:
        """Whether hooks log their boundaries (``_defer``) and past how many entries the
        log is handed on; the lock is held.

        A debugging component acts at the boundaries of its steps on the training thread.
        A step's index is known only once its entries are applied, but each logged entry
        begins at most one step: with ``n`` steps applied, the log may hold ``first - n - 1``
        entries before one of them could begin step ``first``. Past that it is applied
        here (:meth:`_near_window`), and within ``NEAR_WINDOW`` steps of it, and inside
        the window, nothing is deferred. Called again whenever entries are applied while
        a component is on, and when one moves on (its window passed)."""
        room = INT64_MAX
        debug = self._debug
        if debug is not None:
            first = debug.acts_from()
            if first is not None:
                room = first - self._next_index
        timed = self._cuda  # the device is timed: events and memory go in stamps
        self._defer = (
            (timed or not self._cuda_in_use())  # (in use, not bound yet: at once, to bind)
            and self._flop_probe is None
            and (timed or not self._scalar_events)
            and room > NEAR_WINDOW
        )
        self.window_room = room
        if self._defer and timed and self._log.__class__ is not StampedLog:
            self._log = StampedLog(self.stamper(), self._log)  # (a thread's hook: stamps)
        # Stamped logs are taken by a thread of their own (the worker): the training
        # thread hands on only a large backlog. With a raw hand-over it pumps as without
        # stamps: its pumps begin the raw sessions, which carry the stamps.
        stamped_alone = timed and self.handover is None
        take = max(self._take_limit, MAX_LOG // 4) if stamped_alone else self._take_limit
        if self._defer and room - 1 < take:
            self._log_limit, self._on_full = room - 1, self._near_window
        else:
            self._log_limit, self._on_full = take, self._taker

    def _near_window(self) -> None:
        """The log is as long as it may be before a debugging window: apply it here (the
        training thread), then hand on what finished as usual."""
        if len(self._log) > self._log_limit:
            self.settle()
        self._taker()

    # -- the state, as callers see it --------------------------------------------------

    @property
    def current_step(self) -> Step | None:
        """The open step, after every deferred boundary has been applied (the lock waits
        for a drain in progress: its entries are off the log but not yet applied)."""
        if self._log or self._raw_out():
            self.settle()
        with self._lock:
            return self._current

    @property
    def pending(self) -> collections.deque[Step]:
        """Finished steps waiting for the worker (deferred boundaries applied first)."""
        if self._log or self._raw_out():
            self.settle()
        return self._pending

    @property
    def finished(self) -> collections.deque[Step]:
        """Finished steps waiting, boundaries still in the log not applied."""
        return self._pending

    @property
    def pending_count(self) -> int:
        """Finished steps waiting now, boundaries still in the log not applied."""
        return len(self._pending)

    def has_work(self) -> bool:
        """Whether the worker has boundaries to apply or finished steps to take (without
        applying anything here: ``pending`` would replay the log on the caller's thread)."""
        return bool(self._log or self._pending)

    def progress_ns(self) -> int:
        """The host time of the training thread's latest boundary as far as this process
        knows, without applying anything or taking the lock (any thread: the hang watch
        reads it; entries and state may change meanwhile, so it only reads)."""
        t = self.progress_floor
        try:
            t = max(t, newest_time(self._log))
            ring = self._ring
            if ring is not None:  # (a raw session's hooks write there instead)
                t = max(t, ring.writer.last_t)
            step = self._current
            if step is not None:
                t = max(t, step.t0, step.phases[-1][P_T1] if step.phases else 0)
            stack = self.step_stack
            if stack:
                t = max(t, stack[-1][S_T0])
            if self._pending:
                t = max(t, self._pending[-1].t1)
        except (IndexError, RuntimeError):  # (changed while read: the next read has it)
            pass
        return t

    def backlog_due(self) -> bool:
        """Whether enough waits for the worker to process before its next batch time:
        a quarter of the log's or of the finished steps' bound (read without the lock)."""
        return len(self._log) >= MAX_LOG // 4 or len(self._pending) >= self.max_pending // 4

    # -- logging an entry, or applying it now ------------------------------------------

    def _record(self, item: tuple[Any, ...], defer: bool) -> None:
        """What every entry method does with its entry once it has read the clock: log it
        (``defer``, normally ``self._defer``), or apply it now after everything logged
        before it, then hand finished steps on if enough wait (outside the lock: the
        taker may replay on this thread). The caller catches what this raises."""
        if defer:
            ring = self._ring
            if ring is not None:
                if ring.put_entry(item):
                    return
                if ring.full():  # (the sidecar fell a ring behind: catch up here first)
                    self.settle()
            log = self._log
            log.append(item)
            if len(log) > self._log_limit:  # hand them on (sidecar), or apply them here
                self._on_full()
            return
        with self._lock:
            # _settle() only when there is something to settle: a call less per hook.
            handover = self.handover
            if self._log or (handover is not None and handover.raw):
                self._settle()
            self._replay(item)
        if self._due:
            self._take_due()

    def settle(self) -> None:
        """Apply every deferred boundary, in the order the hooks logged them.

        In slices, so that a training thread waiting for the lock (an explicit phase
        beside an instrumented loop) waits for one slice, not for the whole backlog.
        """
        while self._log or self._raw_out():
            with self._lock:
                self._settle(SETTLE_SLICE)

    def _raw_out(self) -> bool:
        """Whether entries went to the sidecar unapplied here (handover/raw.py)."""
        return self.handover is not None and bool(self.handover.raw)

    def _catch_up(self) -> None:
        """Apply here what went to the sidecar unapplied (the lock is held)."""
        handover = self.handover
        if handover is not None and handover.raw:
            handover.leave_raw()

    def on_backlog(self, take: Any, entries: int, steps: int) -> None:
        """Call ``take()`` (on the recording thread, with no lock held) once the log holds
        more than ``entries`` entries or ``steps`` finished steps wait: how a feeder in
        this process hands work on without a thread of its own (otel_train/sidecar/)."""
        with self._lock:
            self._take_limit, self._steps_limit, self._taker = entries, steps, take
            self._decide_deferral()

    def holds_anything(self) -> bool:
        """Whether anything was recorded here that has not been handed on (its log, an
        open or finished step, a background tree, loose scalars)."""
        with self._lock:
            return bool(
                self._log
                or self._current is not None
                or self._pending
                or self._scoped
                or self.background_open
                or self._orphans
                or self.loose_scalars
                or self._next_index
            )

    def no_backlog_taker(self) -> None:
        """Back to the default after :meth:`on_backlog`: past ``MAX_LOG`` entries the log
        is applied here, and finished steps wait for the worker."""
        self.on_backlog(self.settle, MAX_LOG, INT64_MAX)

    def _take_due(self) -> None:
        self._due = False
        self._on_full()

    # -- applying the log ----------------------------------------------------------------

    def _settle(self, limit: int = -1) -> None:
        """Apply deferred boundaries (all of them unless ``limit``); the lock is held.

        Locked entry methods run this with an empty log as a rule: the raw handover's
        test is _catch_up() inline, to keep that case to one call."""
        handover = self.handover
        if handover is not None and handover.raw:  # the state first: what went out raw
            handover.leave_raw()
        log = self._log
        popleft = log.popleft
        replay = self._replay_stamped if log.__class__ is StampedLog else self._replay
        try:
            while log:
                # Entries appended meanwhile wait for the next pass (or the next call).
                count = len(log) if limit < 0 else min(limit, len(log))
                self.note_progress(newest_time(log, count))
                if self.marks_idle:
                    self._replay_marking(count, replay)
                else:
                    for _ in range(count):
                        replay(popleft())
                if limit >= 0:
                    break
        except Exception:
            log.clear()
            self._fail()
        if self._debug is not None:
            self._decide_deferral()

    def _replay_marking(self, count: int, replay: Any) -> None:
        """(A replica's settle: the sidecar's.) ``count`` entries of the log replayed, the
        last point among them where nothing was open marked (``idle_mark``, as
        drain.py's: entries applied after it, next step index, step stack)."""
        log = self._log
        mark = None
        for i in range(count):
            if self._is_idle():
                mark = (i, self._next_index, self.step_stack)
            replay(log.popleft())
        if self._is_idle():
            mark = (count, self._next_index, self.step_stack)
        if mark is not None:
            self.idle_mark = (count - mark[0], *mark[1:])
        elif self.idle_mark is not None:  # (an earlier one not reported yet: older now)
            self.idle_mark = (self.idle_mark[0] + count, *self.idle_mark[1:])

    def _replay(self, item: tuple[Any, ...]) -> None:
        """Apply one logged entry: ``(stack, t, kind, ...)``, or ``(None, 0, kind, ...)``
        for what needs no time.

        One function, and positions as literals (layouts.L_STACK, L_TIME, L_KIND): this
        runs once per entry, and under callgrind the call of a separate dispatcher, or
        the three names' global lookups, each add ~1.5% to a replayed plain-loop step."""
        kind = item[2]
        if kind.__class__ is tuple:  # an adapter boundary: (stack, t, b[, samples, tokens])
            close, open_, begin, end, counted = kind
            self._transition_at(item[0], item[1], close, open_, begin, end)
            if counted and (item[3] is not None or item[4] is not None):
                stack = item[0]
                top = stack[-1][S_STEP].mode if stack else EXPLICIT
                if top < BACKGROUND or (top == BACKGROUND and stack is self.step_stack):
                    # (a background or remote tree's batch counts for no step)
                    self._adapter_counts(item[3], item[4], item[5])
        elif kind == ENTER:  # (stack, t, ENTER, name)
            self._enter_at(item[3], item[1], item[0])
        elif kind == EXIT:  # (stack, t, EXIT, name, error)
            self._exit_at(item[1], item[0], item[4], item[3])
        elif kind == STEP_BEGIN:  # (stack, t, STEP_BEGIN, samples, tokens)
            self._scoped_begin_at(item[1], item[3], item[4], item[0])
        elif kind == STEP_END:  # (stack, t, STEP_END)
            self._scoped_end_at(item[1])
        elif kind == SCALARS:  # (stack, 0, SCALARS, [(name, value)])
            self._add_scalars(item[3])
        elif kind == COUNTS:  # (None, 0, COUNTS, samples, tokens, padded): a batch's
            self._adapter_counts(item[3], item[4], item[5])
        elif kind == LINK:  # (None, 0, LINK, parent): the open step's (links.Parent)
            self._link_at(item[3])
        elif kind == ENTER_REMOTE:  # (stack, t, ENTER_REMOTE, name, parent or None, span)
            if item[4] is None and self._current is not None:
                self._enter_at(item[3], item[1], item[0])  # a bad carrier in a step: a phase
            elif self.enabled:  # (the holder counts as an open tree: only if entered)
                holder = self._remote_holder(item[1], item[4], item[5])
                self._enter_at(item[3], item[1], item[0], holder)
        else:  # (None, 0, DISCARD, name): an exhausted loader's step
            self._discard_if_only(item[3])

    def discard_log(self) -> int:
        """Drop the log unapplied (out of time at the end); the steps it ends."""
        with self._lock:
            return step_ends(self.take_log())

    def _is_idle(self) -> bool:
        """No step, phase or background tree open, none waiting to join a step."""
        return not (
            self._current is not None
            or self._scoped
            or self.background_open
            or self._orphans
            or self.step_stack
        )

    # -- the log handed on, and the state taken back (handover/raw.py, replica.py) --------

    @property
    def lock(self) -> threading.RLock:
        """The state machine's lock: a hand-over starts, ends or takes the ring under it."""
        return self._lock

    @property
    def next_index(self) -> int:
        """The index the next step begins with, as far as the log is applied (settle()
        first to count every boundary logged so far)."""
        return self._next_index

    def idle_for_handover(self, room: int, max_logged: int) -> bool:
        """Whether the log may go on unapplied from here (the lock is held): recording
        on, hooks logging without stamps, no debugging window within ``room`` steps, at
        most ``max_logged`` entries logged, and nothing open or waiting here (no step,
        phase or background tree, no finished step)."""
        return (
            self._defer
            and not self._scalar_events  # (a CUDA scalar's event crosses no process)
            and self.window_room > room
            and len(self._log) <= max_logged
            and not self._pending
            and self._is_idle()
            and self.enabled
        )

    def log_length(self) -> int:
        """Entries logged and not applied yet (read without the lock: a figure)."""
        return len(self._log)

    def take_log(self) -> list[tuple[Any, ...]]:
        """The logged entries, oldest first, taken off the log unapplied (entries logged
        meanwhile stay there)."""
        log = self._log
        return list(islice(iter(log.popleft, None), len(log)))

    def log_into(self, ring: Ring) -> bool:
        """Move the logged entries, oldest first, into ``ring``'s slots for the sidecar
        to apply; False if the ring refused one (it and those after it stay logged)."""
        log = self._log
        put = ring.put_stamped if log.__class__ is StampedLog else ring.put_entry
        while log:
            if not put(log[0]):
                return False
            log.popleft()
        return True

    def apply_entries(self, entries: Iterable[tuple[Any, ...]]) -> None:
        """Apply ``entries`` here now, in order, as if logged and settled (the lock is
        held: a raw hand-over's catch-up); while stamps are taken, each with its stamp
        last, as the log's."""
        replay = self._replay_stamped if self._log.__class__ is StampedLog else self._replay
        for entry in entries:
            replay(entry)

    @property
    def stack_getter(self) -> Callable[[], list[list[Any]]]:
        """What returns the calling thread's phase stack (made on its first call): for a
        writer of this recorder's boundaries outside it (ring.py) to call per boundary,
        no frame of ours in between."""
        return self._tls_stack

    @property
    def device_timed(self) -> bool:
        """Whether boundaries take CUDA events and memory figures (the device is bound
        and timed: machine._refresh_cuda)."""
        return self._cuda

    @property
    def steps_hold_events(self) -> bool:
        """Whether a finished step may hold CUDA events to wait for before it is read
        (the device timed, or a CUDA tensor recorded as a scalar); if not, its host
        times are all there is."""
        return self._cuda or self._scalar_events
