"""The hot path: steps and phases recorded as plain tuples, no OTel calls, no locks.

What runs on the training thread per boundary: one ``perf_counter_ns()`` read and one
tuple append to a log; with the device timed also the boundary's stamp (stamps.py: one
``cudaEventRecord`` enqueue and, when memory tracking is on, one allocator-statistics
read). Finished steps go into a bounded deque that the worker drains; when it is full
the oldest step is dropped and counted, never waited for.

Adapter boundaries (``Recorder.transition``) append ``(stack, time, ...)`` to the
log and return; the step/phase state machine replays the log later, under
a lock, on whichever thread settles it first (deferred.py). Python code right after a
step's kernels runs on cold caches (a ``perf_counter_ns`` pair costs ~0.15-0.4 us there
against 0.05 us warm), so the fewer objects a hook touches, the less it costs; the
worker replays a delivery of steps on warm caches.

:class:`Recorder` is the one class adapters, the session and tests talk to. It is the
top of a stack of layers, each using only those below it: the step machine
(machine.py, with a boundary's stamps: stamps.py), other threads' phase trees
(trees.py), phases (phases.py), the deferred log (deferred.py, with the step shapes
of shapes.py), the entry methods of traces across processes (trace_entries.py), and
here the entry methods the hooks call. The names other modules
import from here (scopes, layouts, limits) are defined in scopes.py and layouts.py.

Usage::

    rec = Recorder(settings)
    with rec.step(samples=32):
        with rec.phase("forward"):
            ...
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from ..settings import Settings
from .collectives import phase_name as collective_phase
from .layouts import (
    COUNTS,
    DISCARD,
    ENTER,
    EXIT,
    S_NAME,
    SCALARS,
    STEP_BEGIN,
    STEP_END,
    PhaseStack,
    Step,
    describe_exception,
    new_stack,
)
from .links import UNSET
from .scopes import (
    ADAPTER,
    B_COUNTED,
    BUILT_WITH,
    CYCLE,
    DATA_FETCHED,
    EXPLICIT,
    MAX_LOG,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_SCALAR_NAMES,
    MAX_STACK,
    Boundary,
    PhaseScope,
    RemotePhaseScope,
    StepScope,
    boundary,
)
from .stamps import Stamp, StampedLog
from .trace_entries import TraceEntries
from .values import clean_count, clean_name, raw_scalar

if TYPE_CHECKING:
    from .debug_hooks import DebugHooks

__all__ = [
    "ADAPTER",
    "BUILT_WITH",
    "CYCLE",
    "DATA_FETCHED",
    "EXPLICIT",
    "MAX_LOG",
    "MAX_MESSAGE",
    "MAX_NAME",
    "MAX_SCALAR_NAMES",
    "MAX_STACK",
    "Boundary",
    "PhaseScope",
    "PhaseStack",
    "Recorder",
    "RemotePhaseScope",
    "Step",
    "StepScope",
    "boundary",
    "describe_exception",
]


class Recorder(TraceEntries):
    """The recorder's entry methods: what hooks and scopes call on the training thread.

    Each one reads the clock, builds its log entry and hands it to ``_record`` (log it,
    or apply it now: deferred.py). Around that, each has the same guard: when recording
    is off it does nothing (but end a FLOP count), and an error inside it disables
    recording instead of reaching the training loop. The guard is written out in each
    method rather than wrapped around them: a wrapping decorator adds a call with packed
    arguments to every hook (counted under callgrind: ~70% more instructions for a
    deferred boundary), and :meth:`log_transition`, the most frequent hook, keeps the
    logging half of ``_record`` inline for the same reason (one call more: ~15%).

    The two entry points the adapters' hooks call per boundary are fields, set in
    ``__init__`` to this recorder's own logging methods; :meth:`route_to` points them at
    a ring's writer while a raw hand-over runs (no Python frame of ours per boundary):

    - ``transition(b)``: :meth:`log_transition`, or the writer's ``transition``;
    - ``counted_transition(b, samples, tokens, padded, t)``: :meth:`log_counted`, or the
      writer's ``counted``.
    """

    transition: Callable[[Boundary], None]
    counted_transition: Callable[..., None]  # (b, samples, tokens, padded, t=0)

    def __init__(
        self, settings: Settings, replay_only: bool = False, debug: DebugHooks | None = None
    ) -> None:
        """``replay_only``: a recorder that only replays logs handed to it (the sidecar's);
        ``debug``: the debugging components' step hooks (no deferral while one is on)."""
        super().__init__(settings, replay_only, debug)
        self._scopes: dict[str, PhaseScope] = {}
        self._scalar_names: set[str] = set()
        self._user_scalars: set[str] = set()  # names record_scalars was given: the user's
        self.dropped_scalars = 0
        # The training thread's collective in flight: (op, group, seq, host t0), or None.
        self.collective_now: tuple[str, str, int | None, int] | None = None
        self.transition = self.log_transition
        self.counted_transition = self.log_counted

    # -- public scopes -------------------------------------------------------------

    def phase(self, name: str) -> PhaseScope:
        # Only str names are cached: others may be unhashable, or objects we must not keep.
        scope = self._scopes.get(name) if name.__class__ is str else None
        if scope is None:
            scope = PhaseScope(self, clean_name(name))
            if name.__class__ is str and len(self._scopes) < 10_000:
                self._scopes[name] = scope
        return scope

    def remote_phase(self, name: str, parent: Any) -> RemotePhaseScope:
        """A phase of another process's step, named by its carrier (links.py)."""
        return RemotePhaseScope(self, clean_name(name), self._parent_of(parent, "phase"))

    def step(
        self, samples: int | None = None, tokens: int | None = None, parent: Any = UNSET
    ) -> StepScope:
        """``parent``: a carrier from another process: the step joins that trace."""
        link = None if parent is UNSET else self._parent_of(parent, "step")
        return StepScope(self, clean_count(samples), clean_count(tokens), link)

    # -- phases ----------------------------------------------------------------------

    def enter(self, name: str) -> None:
        if not self.enabled:
            self._disabled()
            return
        try:
            self._record((self._tls_stack(), perf_counter_ns(), ENTER, name), self._defer)
        except Exception:
            self._fail()

    def exit(self, exc_type: Any = None, exc: Any = None, name: str | None = None) -> None:
        if not self.enabled:
            self._disabled()
            return
        try:
            t = perf_counter_ns()
            error = self._describe(exc_type, exc) if exc_type is not None else None
            self._record((self._tls_stack(), t, EXIT, name, error), self._defer)
        except Exception:
            self._fail()

    def log_transition(self, b: Boundary) -> None:
        """An adapter hook's whole work in one call, at one timestamp: boundary ``b``
        (see :func:`boundary`).

        The call logs ``b`` with the time and this thread's phase stack (see the module
        docstring; with the device timed the log adds the stamp), or applies it at once
        while nothing may be deferred (a FLOP count, a debugging window near, CUDA just
        come into use). ``b`` is never ``counted``: a counted
        boundary's entry carries the batch's counts (:meth:`data_fetched`).
        """
        if not self.enabled:
            self._disabled()
            return
        try:
            if self._defer:  # _record's logging half, inline: the most frequent hook
                tls = self._tls
                try:
                    stack = tls.stack
                except AttributeError:
                    stack = tls.stack = new_stack()
                log = self._log
                log.append((stack, perf_counter_ns(), b))
                if len(log) > self._log_limit:  # hand them on (sidecar), or apply them here
                    self._on_full()
                return
            self._record((self._tls_stack(), perf_counter_ns(), b), False)
        except Exception:
            self._fail()

    # -- the ring's way in and back (ring.py) ------------------------------------------

    def route_to(self, ring: Any) -> None:
        """From now on the hooks' boundaries go straight to ``ring``'s writer (the C one:
        no Python frame of ours), a raw session's hand-over (handover/raw.py); ``None``:
        back to this recorder's own logging methods."""
        self._ring = ring
        if ring is None:
            self.transition, self.counted_transition = self.log_transition, self.log_counted
        else:
            self.transition, self.counted_transition = ring.writer.transition, ring.writer.counted

    # -- what the ring's writer did not take -----------------------------------------

    def refused_write(
        self, b: Boundary, samples: int | None, tokens: int | None, padded: int | None, t: int
    ) -> None:
        """A boundary the ring's writer did not take (full, closed meanwhile, or
        recording off): logged as without a ring, after catching up here if it is full
        (the sidecar fell a ring behind)."""
        ring = self._ring
        if ring is not None and self.enabled and ring.full():
            self.settle()
        if b[B_COUNTED]:
            self.log_counted(b, samples, tokens, padded, t)
        else:
            self.log_transition(b)

    def ring_due(self) -> None:
        """The ring's writer passed the position it was told to report: hand on now;
        at the end a debugging window ahead set for the session, apply it here first."""
        handover, ring = self.handover, self._ring
        if handover is not None and ring is not None and ring.writer.pos >= handover.ends_at:
            self.settle()  # (leaves the session: the window's steps are applied here)
        self._on_full()

    def watch_cuda(self) -> None:
        """(The thread that hands steps on, now and then.) CUDA showed up while the
        hooks log their boundaries: apply the log, and apply the next boundary at once,
        on its own thread, which binds the device (machine._refresh_cuda); from then on
        the hooks log again, each boundary with its event and memory figures (stamps.py).
        What was logged before stays host-timed."""
        try:
            if self._defer and not self._cuda and self._want_cuda and self._cuda_in_use():
                with self._lock:
                    self._settle()  # (a raw session ends first: its slots applied here)
                    self._decide_deferral()
        except Exception:  # (recording off, logged once: the caller's thread goes on)
            self._fail()

    # -- collectives (collectives.py): phases of their own, and what is in flight -------

    def collective_enter(self, op: str, group: str, seq: int | None) -> None:
        """A blocking collective begins on this thread: its phase, and (on the training
        thread) what a hang record names while it runs."""
        if not self.enabled:
            self._disabled()
            return
        try:
            stack = self._tls_stack()
            t = perf_counter_ns()
            if stack is self.step_stack or self.step_stack is None:
                self.collective_now = (op, group, seq, t)
            self._record((stack, t, ENTER, collective_phase(op, group)), self._defer)
        except Exception:
            self._fail()

    def collective_exit(self, op: str, group: str, exc_type: Any = None, exc: Any = None) -> None:
        self.collective_now = None
        self.exit(exc_type, exc, collective_phase(op, group))

    def waited(self, op: str, group: str, t0: int, t1: int, ev0: Any = None) -> None:
        """A collective waited for from ``t0`` to ``t1`` inside the open phase, known only
        now (DDP's gradient all-reduce, at the end of backward): its phase, after the fact.
        ``ev0``: the device event taken at ``t0`` (:meth:`device_event`), so that on a GPU,
        where the host does not wait, the phase is the device's wait."""
        if not self.enabled or t1 <= t0:
            self.events.release(ev0)
            return
        try:
            stack, name = self._tls_stack(), collective_phase(op, group)
            enter, leave = (stack, t0, ENTER, name), (stack, t1, EXIT, name, None)
            if ev0 is None or not self._cuda:
                self._record(enter, self._defer)
                self._record(leave, self._defer)
                return
            now = self.stamper()()  # (the end's event and sample; the start's event)
            self._record_stamped(enter, (ev0, now[1], now[2]))
            self._record_stamped(leave, now)
        except Exception:
            self._fail()

    def _record_stamped(self, item: tuple[Any, ...], stamp: Stamp) -> None:
        """``item`` with a stamp taken before: logged as the hooks log, or applied now."""
        log = self._log
        if self._defer and isinstance(log, StampedLog):
            log.append_stamped(item, stamp)
            return
        with self._lock:
            self._settle()
            self._replay_stamped((*item, stamp))

    def device_event(self) -> Any:
        """(Any thread.) An event recorded now on this thread's stream of the bound
        device, for a boundary placed later (:meth:`waited`); None with no device timed."""
        return self.events.record() if self._cuda else None

    def exit_if_top(self, name: str, exc_type: Any = None, exc: Any = None) -> bool:
        """Exit the innermost open phase if it is ``name`` (adapters' inferred boundaries)."""
        try:
            t = perf_counter_ns()
            with self._lock:
                self._settle()
                stack = self._tls_stack()
                if stack and stack[-1][S_NAME] == name:
                    error = self._describe(exc_type, exc) if exc_type is not None else None
                    self._exit_at(t, stack, error)
                    return True
                return False
        except Exception:
            self._fail()
            return False

    def open_phase_names(self) -> list[str]:
        try:
            with self._lock:
                self._settle()
                return [e[S_NAME] for e in self._tls_stack()]
        except Exception:
            self._fail()
            return []

    # -- steps -----------------------------------------------------------------------

    def begin_step(
        self, mode: int, samples: int | None = None, tokens: int | None = None
    ) -> Step | None:
        """Open a step of ``mode`` now (never deferred: the caller gets the step)."""
        if not self.enabled:
            self._disabled()
            return None
        try:
            t = perf_counter_ns()
            with self._lock:
                self._settle()
                return self._begin_at(mode, t, samples, tokens, self._tls_stack())
        except Exception:
            self._fail()
            return None

    def end_step(self, mode: int) -> None:
        """End the open step now if ``mode`` may end it (see StepMachine._end_at)."""
        if not self.enabled:
            self._disabled()
            return
        try:
            t = perf_counter_ns()
            with self._lock:
                self._settle()
                self._end_at(t, mode)
            if self._due:
                self._take_due()
        except Exception:
            self._fail()

    # Scoped explicit steps (``with step():``, a method-map adapter's step method): their
    # ends pair with their begins, so a nested one neither opens nor ends a step.

    def step_begin(self, samples: int | None = None, tokens: int | None = None) -> None:
        if not self.enabled:
            self._disabled()
            return
        try:
            t = perf_counter_ns()
            self._record((self._tls_stack(), t, STEP_BEGIN, samples, tokens), self._defer)
        except Exception:
            self._fail()

    def step_end(self) -> None:
        if not self.enabled:
            self._disabled()
            return
        try:
            self._record((self._tls_stack(), perf_counter_ns(), STEP_END), self._defer)
        except Exception:
            self._fail()

    # -- counts ------------------------------------------------------------------------

    def add_counts(self, samples: int | None, tokens: int | None, padded: int | None) -> None:
        """A batch's counts (``padded``: its tokens padding included, see
        adapters/batches.py) for the step open now."""
        with self._lock:
            self._settle()
            step = self._current
            if step is not None:
                self._add_counts(step, samples, tokens, padded)

    def data_fetched(
        self, t: int, samples: int | None, tokens: int | None, padded: int | None
    ) -> None:
        """A loader's fetch ended at ``t``: exit its ``data`` phase and add the batch's
        counts to the adapter step open then (one log entry instead of two)."""
        self.counted_transition(DATA_FETCHED, samples, tokens, padded, t)

    def log_counted(
        self, b: Boundary, samples: int | None, tokens: int | None, padded: int | None,
        t: int = 0,
    ) -> None:  # fmt: skip
        """Boundary ``b`` (made with ``counted=True``) at ``t`` (0: now), adding a batch's
        counts to the adapter step open after it: the step that consumes the batch."""
        if not self.enabled:
            self._disabled()
            return
        try:
            entry = (self._tls_stack(), t or perf_counter_ns(), b, samples, tokens, padded)
            self._record(entry, self._defer)
        except Exception:
            self._fail()

    # Counts and discards have no guard: they still reach the state machine (at once) when
    # recording is off, and the adapters calling them catch what they raise.

    def log_counts(self, samples: int | None, tokens: int | None, padded: int | None) -> None:
        """Counts from the batch just fetched, for the adapter step open at this point."""
        self._record((None, 0, COUNTS, samples, tokens, padded), self._defer and self.enabled)

    def discard_step_if_only(self, name: str) -> None:
        """Drop an adapter-opened step that holds nothing but ``name`` (an exhausted loader)."""
        # (logged like a boundary, at each epoch's end)
        self._record((None, 0, DISCARD, name), self._defer and self.enabled)

    # -- user scalars ------------------------------------------------------------------

    def end_background(self) -> int:
        """At shutdown: drop background phases no step took (machine._end_background)."""
        try:
            self.settle()
            with self._lock:
                return self._end_background()
        except Exception:
            self._fail()
            return 0

    def record_scalars(self, values: dict[str, Any]) -> None:
        """Keep ``values`` for the step open now (else as loose scalars): bounded names,
        and values that need no device read (a CUDA tensor is copied without a sync).
        What the user records (``otel_train.record``): its names are theirs from now on."""
        self._keep_scalars(values, self._user_scalars.add)

    def take_scalars(self, values: dict[str, Any]) -> None:
        """Scalars an adapter takes by itself (a trainer's loss, its learning rate): kept
        like the user's, but a name the user has recorded is left to the user."""
        user = self._user_scalars
        if user:
            values = {k: v for k, v in values.items() if k not in user}
        if values:
            self._keep_scalars(values, None)

    def _keep_scalars(self, values: dict[str, Any], mark: Any) -> None:
        if not self.enabled:
            return
        try:
            items = []
            names = self._scalar_names  # (set operations are atomic under the GIL)
            for key, value in values.items():
                name = clean_name(key)
                if mark is not None:
                    mark(name)
                if name not in names:
                    if len(names) >= MAX_SCALAR_NAMES:
                        self.dropped_scalars += 1  # bounded series: new names past the cap
                        continue
                    names.add(name)
                item = raw_scalar(value, self.events)
                if item is not None:
                    items.append((name, item))
                    if item.__class__ is tuple and not self._scalar_events:
                        self.bind_for_scalars()
                        self._device_scalars()
            if items:  # (with this thread's stack: a recognised step may hold it)
                self._record((self._tls_stack(), 0, SCALARS, items), self._defer)
        except Exception:
            self._fail()
