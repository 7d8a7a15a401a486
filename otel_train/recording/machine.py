"""The step state machine: which step is open, how one opens and closes, and what a
finished step carries to the worker.

Every ``*_at`` method here applies one event at a time ``t`` that was read earlier (on
the training thread, perhaps long before), so the same code serves the training thread
applying a boundary at once and any thread replaying the deferred log (deferred.py).
The caller holds the recorder's lock, or owns the object alone (the scratch machine that
learns a step's shape, shapes.py). Nothing here reads the clock or the log: the machine
is a function of the events it is handed, which is what lets a replay reproduce it.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import TYPE_CHECKING, Any

from ..settings import ConfigError, Settings
from . import capture
from .device import EventPool, ResolvedPool
from .layouts import (
    P_EV0,
    P_EV1,
    P_NAME,
    P_PARENT,
    P_SEQ,
    PeakStacks,
    Step,
    new_stack,
)
from .links import CarrierGate, StepLinks
from .scopes import (
    ADAPTER,
    CYCLE,
    EXPLICIT,
    HOST_PHASES,
    INT64_MAX,
    MAX_STACK,
)
from .stamps import BoundaryStamps
from .values import add_count

if TYPE_CHECKING:
    import torch  # (bound by _import_torch())

    from .debug_hooks import DebugHooks
    from .memory import CudaMemoryTracker

_log = logging.getLogger("otel_train")


def _import_torch() -> None:
    """Import torch for the device paths here, in device.py and in values.py. A recorder
    of the training process does when it is built; a replay-only one, which only replays
    logs (it never times the device or takes a value from the user), does not, so the
    sidecar never imports torch. (Bound as each module's global, the hot paths read ``torch``
    as they would a module-level import.)"""
    global torch
    import torch

    from . import device, stamps, values

    device.import_torch()
    stamps.import_torch()
    values.import_torch()


def _times_the_device(settings: Settings) -> bool:
    """Whether a recorder of the training process times the device with CUDA events
    (torch imported here for it); a ConfigError for ``device_timing="cuda"`` without CUDA."""
    _import_torch()
    if settings.device_timing == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "otel_train setting 'device_timing' is 'cuda' but CUDA is not available; "
            "accepted values: 'auto', 'cuda', 'off'"
        )
    # is_available() costs ~0.5 us even on a CPU build: ask once, not per step.
    return settings.device_timing != "off" and torch.cuda.is_available()


class StepMachine(StepLinks, BoundaryStamps):
    """The recorder's state and its step transitions (phases: phases.py)."""

    def __init__(
        self, settings: Settings, replay_only: bool = False, debug: DebugHooks | None = None
    ) -> None:
        """``replay_only``: a machine that only replays logs and never times the device (the
        sidecar's copy, the scratch machine of shapes.py); ``debug``: the profiler
        window / memory snapshot hooks, when one is on."""
        BoundaryStamps.__init__(self)
        self.settings = settings
        self.enabled = True
        self._pending: collections.deque[Step] = collections.deque()
        self.max_pending = settings.max_pending_steps
        self.dropped_steps = 0
        self.dropped_phases = 0
        # The bound device's (device.py): every event comes from it; a replica's events
        # come resolved with its entries (ResolvedPool).
        self.events = ResolvedPool() if replay_only else EventPool()
        self.memory: CudaMemoryTracker | None = None
        self._cuda = False
        # The CUDA device events and memory figures are taken on: the model's (bind_device),
        # else the training thread's current device when CUDA first shows up.
        self.device: int | None = None
        self._replay_only = replay_only
        self._want_cuda = not replay_only and _times_the_device(settings)
        # Whether hooks log their boundaries, to be applied later (deferred.py); with the
        # device timed, each with its event and memory figures taken there (stamps.py).
        self._defer = False
        self._debug = debug  # profiler window / memory snapshot, usually off
        # FLOP counting (processing/flops.py): set only while a step is to be counted.
        self._flop_probe: Any = None
        self._tls = threading.local()
        self._current: Step | None = None
        self._next_index = 0
        self._scoped: list[Step | None] = []  # what each open scoped step opened
        self.compiled_seen = False  # an adapter saw its model run under torch.compile
        # The dtype autocast (or the trainer's precision setting) runs forwards in, as an
        # adapter saw it: MFU's peak without a FLOP count (efficiency.py, precision.py).
        self.precision_hint: str | None = None
        # The phase stack (one per thread) of the thread that opens explicit/adapter steps.
        self.step_stack: list[list[Any]] | None = None
        # Every thread's stack that has had a phase with memory figures (layouts.PeakStacks).
        self._peak_stacks = PeakStacks()
        # Background phase trees (phases.py) that ended with no step open: they join the
        # next step to end. And how many trees are open on background threads now.
        self._orphans: collections.deque[Step] = collections.deque()
        self.background_open = 0
        self._background_warned = False
        self._failed_once = False
        self.loose_scalars: collections.deque[tuple[str, Any]] = collections.deque(maxlen=4096)
        # Past this many finished steps, _due asks the call that closed the last one to
        # hand them on when it returns (DeferredLog.on_backlog).
        self._steps_limit = INT64_MAX
        self._due = False
        # Whether carriers may say sampled: step spans leave here and take the ids a
        # carrier names (the session sets it), and which of them do (links.py).
        self.carriers = False
        self._gate = CarrierGate(settings)
        # Remote trees' figures by their span's id, until produced() takes them.
        self.produced_figures: dict[int, tuple[float, Any]] = {}

    def _tls_stack(self) -> list[list[Any]]:
        tls = self._tls
        try:
            return tls.stack  # type: ignore[no-any-return]
        except AttributeError:
            tls.stack = new_stack()
            return tls.stack  # type: ignore[no-any-return]

    # -- failure ---------------------------------------------------------------------

    def _disabled(self) -> None:
        """A call while recording is off: a FLOP count cut short by it ends on this thread."""
        probe = self._flop_probe
        if probe is not None:
            probe.abort()

    def _fail(self) -> None:
        """An error inside telemetry: log once, disable recording, never raise."""
        self.enabled = False
        self._disabled()
        if not self._failed_once:
            self._failed_once = True
            _log.exception("otel-train: internal error while recording; recording disabled")

    # -- opening and closing steps -----------------------------------------------------

    def bind_device(self, index: int | None) -> None:
        """Take events and memory figures on CUDA device ``index`` (the model's), unless a
        device is bound already (with the device not timed: a CUDA scalar's copy events,
        queried on it)."""
        if index is not None and self.device is None and not self._replay_only:
            self.device = self.events.device = index

    def bind_for_scalars(self) -> None:
        """(The recording thread, at its first CUDA scalar.) Its copy events are queried
        on the bound device: this thread's if none is bound yet (else a reader would make
        a context on device 0), and CUDA-graph captures guarded (no query during one)."""
        if self.device is None:
            self.device = self.events.device = torch.cuda.current_device()
        capture.install()

    def _cuda_in_use(self) -> bool:
        """Whether this process uses CUDA now, so that the device is timed."""
        return self._cuda or (self._want_cuda and torch.cuda.is_initialized())  # type: ignore[no-untyped-call]

    def _refresh_cuda(self) -> None:
        # Cheap re-check until CUDA shows up: we never create a CUDA context ourselves.
        # Not while boundaries are logged: an event recorded as the log is applied would
        # time nothing (CUDA showing up ends the logging first: Recorder.watch_cuda, and
        # the first step applied at once binds the device here; then the hooks log again,
        # with stamps: _decide_deferral).
        if self._want_cuda and not self._defer and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            if self.device is None:
                self.device = self.events.device = torch.cuda.current_device()
            capture.install()
            self._cuda = True
            if self.settings.memory and self.memory is None:
                from .memory import CudaMemoryTracker  # (once: CUDA showed up)

                self.memory = CudaMemoryTracker(self.settings.reset_peak_memory, self.device)
            self._decide_deferral()

    def _decide_deferral(self) -> None:
        """Whether hooks log their boundaries (deferred.py): a bare machine never does."""

    def _thread_device(self) -> int | None:
        """The device a background or remote tree on this thread is timed on: the bound
        one if it is this thread's current device, else None (host time: an event on the
        bound device's stream would time another thread's work)."""
        if not self._cuda:
            return None
        if self._stamp is not None:  # (replayed: the hook's thread, as its stamp says)
            return self._stamp_device()
        return self.device if torch.cuda.current_device() == self.device else None

    def _release_timing(self, step: Step) -> None:
        ev = self.events
        ev.release(step.ev0)
        ev.release(step.ev1)
        for p in step.phases:
            ev.release(p[P_EV0])
            ev.release(p[P_EV1])

    def _end_events(self, step: Step) -> None:
        """Record ``step``'s end event; a capture that began meanwhile (no event now) makes
        it a host-timed step, its events back in the pool."""
        if step.ev0 is None:
            return
        step.ev1 = self._boundary_event()
        if step.ev1 is None:
            self._release_timing(step)
            step.ev0 = None
            step.phases = [(*r[:P_EV0], None, None, *r[P_EV1 + 1 :]) for r in step.phases]

    def _begin_at(
        self,
        mode: int,
        t: int,
        samples: int | None = None,
        tokens: int | None = None,
        stack: list[list[Any]] | None = None,
    ) -> Step | None:
        """Open a step at ``t``; ``stack`` is the phase stack of the thread opening it."""
        if not self.enabled:
            return None
        try:
            current = self._current
            if current is not None:
                if mode == EXPLICIT and current.mode == EXPLICIT:
                    return None  # nested explicit step: the outer one stands
                if self._adopt(current, mode, samples, tokens, stack):
                    return current
                self._close(current, t)
            if self._want_cuda and not self._cuda:
                self._refresh_cuda()
            if self._cuda:
                step = Step(self._next_index, t, mode, self._boundary_event(), self.device)
            else:
                step = Step(self._next_index, t, mode, None, None)
            if mode != CYCLE:
                self.step_stack = stack
            step.samples, step.tokens = samples, tokens
            self._next_index += 1
            self._current = step
            if self._debug is not None:
                self._debug.step_started(step.index)
            if self._flop_probe is not None and stack is self._tls_stack():
                # (a boundary logged before the probe was armed may be replayed on the
                # worker: the dispatch mode belongs on the step's own thread)
                self._flop_probe.begin(step)
            return step
        except Exception:
            self._fail()
            return None

    @staticmethod
    def _adopt(
        current: Step,
        mode: int,
        samples: int | None,
        tokens: int | None,
        stack: list[list[Any]] | None,
    ) -> bool:
        """``for batch in loader: with step():`` -- the instrumented loader's fetch opened
        ``current``; it belongs to the user's step, not a step of its own: make it that."""
        if not (
            mode == EXPLICIT
            and current.mode == ADAPTER
            and not stack
            and all(p[P_NAME] in HOST_PHASES for p in current.phases)
        ):
            return False
        current.mode = EXPLICIT
        if samples is not None or tokens is not None:
            current.samples, current.tokens, current.padded = samples, tokens, None
        return True

    def _close(self, step: Step, t1: int) -> None:
        if self._flop_probe is not None:
            self._flop_probe.end(step, t1)
        step.t1 = t1
        self._end_events(step)
        step.closed = True
        self._current = None
        orphans = self._orphans
        while orphans:
            self._home(orphans.popleft(), step)
        if self._debug is not None:
            self._debug.step_ended(step.index)
            step.events = self._debug.step_events(step.index) or None
        self._queue(step)

    def _queue(self, step: Step) -> None:
        """A finished step (or remote tree) waits for the worker; the oldest is dropped
        past ``max_pending``."""
        pending = self._pending
        if len(pending) >= self.max_pending:
            try:
                old = pending.popleft()
                self.dropped_steps += 1
                self._release_step(old)
            except IndexError:
                pass
        pending.append(step)
        if len(pending) >= self._steps_limit:
            self._due = True  # handed on when the call that closed it returns

    @staticmethod
    def _home(holder: Step, step: Step) -> None:
        """Move a background tree's rows into ``step``, numbered after its own."""
        base = step.seq
        step.seq = base + holder.seq
        rows = step.phases
        for row in holder.phases:
            parent = row[P_PARENT]
            rows.append((row[P_SEQ] + base, parent + base if parent >= 0 else -1, *row[2:]))
        if holder.error:
            step.error = True

    def release_finished(self, gone: bool) -> None:
        """Every finished step waiting now, released unresolved (another consumer has
        them); none if ``gone``. The feeder's thread takes from the same queue without
        the lock: a step is popped before it is looked at, never checked then popped."""
        pending = self._pending
        while not gone:
            try:
                step = pending.popleft()
            except IndexError:
                return
            self._release_step(step)

    def _release_step(self, step: Step) -> None:
        """A step no one will resolve: every event it holds back to the pool."""
        self._release_timing(step)
        ev = self.events
        for _, raw in step.scalars or ():
            if raw.__class__ is tuple:  # a CUDA scalar's copy event (values.raw_scalar)
                ev.release(raw[1])

    def _end_at(self, t: int, mode: int) -> None:
        """End the open step if ``mode`` ends it: its own, or an adapter's optimizer step
        ending a step that bare phases opened."""
        step = self._current
        if step is None:
            return
        if step.mode != mode and not (mode == ADAPTER and step.mode == CYCLE):
            return
        self._close(step, t)

    # Scoped explicit steps (``with step():``, a method-map adapter's step method): their
    # ends pair with their begins, so a nested one neither opens nor ends a step.

    def _scoped_begin_at(
        self, t: int, samples: int | None, tokens: int | None, stack: list[list[Any]]
    ) -> None:
        scoped = self._scoped
        if len(scoped) >= MAX_STACK:  # scopes entered and never left: forget the oldest
            del scoped[0]
        scoped.append(self._begin_at(EXPLICIT, t, samples, tokens, stack))

    def _scoped_end_at(self, t: int) -> None:
        opened = self._scoped.pop() if self._scoped else None
        if opened is not None and opened is self._current and self.enabled:
            self._close(opened, t)

    # -- what a step carries besides its phases ------------------------------------------

    @staticmethod
    def _add_counts(
        step: Step, samples: int | None, tokens: int | None, padded: int | None
    ) -> None:
        step.samples = add_count(step.samples, samples)
        step.tokens = add_count(step.tokens, tokens)
        step.padded = add_count(step.padded, padded)

    def _adapter_counts(self, samples: int | None, tokens: int | None, padded: int | None) -> None:
        """A batch's counts go to an adapter's step only: an explicit step carries the
        user's own counts."""
        step = self._current
        if step is not None and step.mode == ADAPTER:
            self._add_counts(step, samples, tokens, padded)

    def _add_scalars(self, items: list[tuple[str, Any]]) -> None:
        """Scalars belong to the step open when they were recorded (else they stand alone)."""
        step = self._current
        if step is not None:
            if step.scalars is None:
                step.scalars = []
            step.scalars.extend(items)
        else:
            self.loose_scalars.extend(items)

    def _discard_if_only(self, name: str) -> None:
        step = self._current
        if step is None or step.mode != ADAPTER:
            return
        if all(p[P_NAME] == name for p in step.phases):
            self._current = None
            if step.index == self._next_index - 1:
                self._next_index -= 1  # keep step indices contiguous across epochs
            self._release_step(step)
