"""The hot path: steps and phases recorded as plain tuples, no OTel calls, no locks.

What runs on the training thread per phase: two ``perf_counter_ns()`` reads, a
stack push/pop and one tuple append; with CUDA also two ``cudaEventRecord``
enqueues and (when memory tracking is on) two allocator-statistics reads. Finished
steps go into a bounded deque that the worker drains; when it is full the oldest
step is dropped and counted, never waited for.

Adapter boundaries on a CPU-only process (:meth:`Recorder.transition`) are cheaper
still: the hook appends ``(stack, time, ...)`` to a log and returns; the step/phase
state machine replays the log later, under a lock, on whichever thread settles it
first (normally the worker; any other recorder call settles before it runs, so the
state every caller sees is the same as if nothing had been deferred). Python code
right after a step's kernels runs on cold caches (a ``perf_counter_ns`` pair costs
~0.15-0.4 us there against 0.05 us warm), so the fewer objects a hook touches, the less
it costs; the worker replays a batch of steps on warm caches. Runs of steps whose
boundaries repeat a known shape are not replayed one by one: :meth:`drain_blocks` hands
them to the worker as columns (recording/blocks.py).

Usage::

    rec = Recorder(settings, on_internal_error=log_once)
    with rec.step(samples=32):
        with rec.phase("forward"):
            ...
"""

from __future__ import annotations

import collections
import logging
import threading
import traceback
from itertools import islice
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Literal

import torch

from ..settings import Settings
from .blocks import KIND, MAX_TEMPLATE, MAX_TEMPLATES, STACK, StepBlock, Template
from .device import EventPool
from .memory import CudaMemoryTracker
from .resolved import HOST_PHASES

if TYPE_CHECKING:
    from .debug_hooks import DebugHooks

_log = logging.getLogger("otel_train")

# How an open step is closed.
EXPLICIT = 0  # by the end of ``with step()`` or the adapter's step method
CYCLE = 1  # opened by a bare phase(): closed when a top-level phase name repeats
ADAPTER = 2  # opened and closed by a trainer adapter (data fetch ... optimizer step)

MAX_NAME = 128
MAX_MESSAGE = 1024
MAX_STACK = 8192
MAX_SCALAR_NAMES = 256
MAX_LOG = 4096  # deferred boundaries held before the training thread applies them
SETTLE_SLICE = 64  # boundaries applied per hold of the lock by settle()
_INT64_MAX = 2**63 - 1

# Deferred-log entries are ``(stack, time, kind, ...)``. An adapter boundary's kind is the
# boundary itself (a tuple from ``boundary()``); the other kinds are these (see _apply).
ENTER, EXIT, STEP_BEGIN, STEP_END, SCALARS, COUNTS, DISCARD = range(7)
Boundary = tuple[str | None, str | None, int, int, bool]


def boundary(
    close: str | None, open_: str | None, begin: int = 0, end: int = 0, counted: bool = False
) -> Boundary:
    """An adapter hook's boundary for :meth:`Recorder.transition`, made once per hook site.

    Exit ``close`` if it is the innermost open phase; end the step if ``end`` (a mode) may
    end it; open a step of mode ``begin`` if none is open; enter ``open_`` if a step is
    (then) open. ``counted``: the entry carries the batch's (samples, tokens). Hooks log
    the same objects every step, so the worker recognises a repeating step by identity
    (recording/blocks.py).
    """
    return (close, open_, begin, end, counted)


# A loader's fetch ended: exit its ``data`` phase and count the batch.
DATA_FETCHED = boundary("data", None, counted=True)


class PhaseStack(list):  # type: ignore[type-arg]
    """A thread's phase stack; equal only to itself (the worker counts a thread's
    entries in a log by comparing stacks, and two threads' empty stacks are not one)."""

    __slots__ = ()
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        # Shipped to the sidecar as a token: its replica keeps one stack per token.
        return (stack_of, (id(self),))


_REPLICA_STACKS: dict[int, PhaseStack] = {}


def stack_of(token: int) -> PhaseStack:
    """The sidecar replica's stack for a training-process stack's token."""
    stack = _REPLICA_STACKS.get(token)
    if stack is None:
        stack = _REPLICA_STACKS[token] = PhaseStack()
    return stack


def replica_stacks() -> dict[int, PhaseStack]:
    return _REPLICA_STACKS


class OpenStep:
    """A step being recorded, then handed to the worker as is."""

    __slots__ = (
        "closed",
        "device",
        "error",
        "ev0",
        "ev1",
        "index",
        "mode",
        "phases",
        "samples",
        "scalars",
        "seq",
        "t0",
        "t1",
        "tokens",
        "top",
    )

    def __init__(self, index: int, t0: int, mode: int, ev0: Any, device: int | None) -> None:
        self.index = index
        self.t0 = t0
        self.t1 = 0
        self.mode = mode
        self.ev0 = ev0
        self.ev1: Any = None
        self.samples: int | None = None
        self.tokens: int | None = None
        # (seq, parent_seq, name, t0, t1, ev0, ev1, memory, error, host seconds): the
        # worker's rows as they are when the phase has no events (the CPU case)
        self.phases: list[tuple[Any, ...]] = []
        self.error = False  # a phase ended with an exception
        self.seq = 0
        self.top: set[str] | None = set() if mode == CYCLE else None
        self.scalars: list[tuple[str, Any]] | None = None
        self.closed = False
        self.device = device


def describe_exception(exc_type: type[BaseException], exc: BaseException | None) -> tuple[Any, ...]:
    """A small, frame-free description: keeping the exception would keep its frames alive."""
    message = str(exc)[:MAX_MESSAGE] if exc is not None else ""
    stack = "".join(traceback.format_exception(exc_type, exc, exc.__traceback__ if exc else None))
    oom = None
    if isinstance(exc, torch.cuda.OutOfMemoryError) and torch.cuda.is_available():
        try:
            oom = (
                int(torch.cuda.memory_allocated()),
                int(torch.cuda.memory_reserved()),
                int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory),
            )
        except Exception:  # telemetry must not mask the user's OOM
            oom = None
    return (exc_type.__qualname__, message, stack[-8192:], oom)


class PhaseScope:
    """``with recorder.phase(name):``; cached per name, re-entrant (state lives on a stack)."""

    __slots__ = ("_name", "_rec")

    def __init__(self, rec: Recorder, name: str) -> None:
        self._rec = rec
        self._name = name

    def __enter__(self) -> PhaseScope:
        self._rec.enter(self._name)
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Literal[False]:
        self._rec.exit(et, ev, self._name)
        return False


class StepScope:
    __slots__ = ("_rec", "_samples", "_tokens")

    def __init__(self, rec: Recorder, samples: int | None, tokens: int | None) -> None:
        self._rec = rec
        self._samples = samples
        self._tokens = tokens

    def __enter__(self) -> StepScope:
        self._rec.step_begin(self._samples, self._tokens)
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Literal[False]:
        # A nested step opened nothing (the outer one stands): it does not end the outer one.
        self._rec.step_end()
        return False


class Recorder:
    def __init__(self, settings: Settings, replica: bool = False) -> None:
        """``replica``: the sidecar's copy, which only replays logs shipped to it."""
        self.settings = settings
        self.enabled = True
        self._pending: collections.deque[OpenStep] = collections.deque()
        # Deferred boundaries, counts and scalars; their shapes are listed in _settle.
        self._log: collections.deque[tuple[Any, ...]] = collections.deque()
        self._lock = threading.RLock()  # the state machine runs on one thread at a time
        self.max_pending = settings.max_pending_steps
        self.dropped_steps = 0
        self.dropped_phases = 0
        self.events = EventPool()
        self.memory: CudaMemoryTracker | None = None
        self._cuda = False
        # is_available() costs ~0.5 us even on a CPU build: ask once, not per step.
        self._want_cuda = (
            not replica and settings.device_timing != "off" and torch.cuda.is_available()
        )
        # The sidecar's raw handover (sidecar/raw.py) while the log goes out unapplied:
        # anything that needs this recorder's state has it catch up first.
        self.handover: Any = None
        self._debug: DebugHooks | None = None  # profiler window / memory snapshot, usually off
        # FLOP counting (recording/flops.py): set only while a step is to be counted.
        self._flop_probe: Any = None
        # Without CUDA nothing must be read at a boundary but the clock: defer the rest.
        self._defer = self._may_defer()
        self._tls = threading.local()
        # Step shapes recognised in the log (blocks.py), by their first boundary.
        self._templates: dict[Boundary, list[Template]] = {}
        self._template_misses = 0  # runs that could not be learned; learning stops at 64
        self.blocks = True  # whether drain_blocks() may take blocks (tests compare both ways)
        self._current: OpenStep | None = None
        self._next_index = 0
        self._scoped: list[OpenStep | None] = []  # what each open scoped step opened
        self.compiled_seen = False  # an adapter saw its model run under torch.compile
        # The phase stack (one per thread) of the thread that opens explicit/adapter steps.
        self.step_stack: list[list[Any]] | None = None
        self._scopes: dict[str, PhaseScope] = {}
        self._scalar_names: set[str] = set()
        self.dropped_scalars = 0
        self._failed_once = False
        self.loose_scalars: collections.deque[tuple[str, Any]] = collections.deque(maxlen=4096)
        # Past these many log entries the log is applied here (the worker fell behind),
        # unless on_backlog() named a taker (the sidecar's feeder, on this thread).
        self._log_limit = MAX_LOG
        self._on_full: Any = self.settle
        self._steps_limit = _INT64_MAX
        self._due = False
        if settings.device_timing == "cuda" and not torch.cuda.is_available():
            from ..settings import ConfigError

            raise ConfigError(
                "otel_train setting 'device_timing' is 'cuda' but CUDA is not available; "
                "accepted values: 'auto', 'cuda', 'off'"
            )

    # -- public scopes -------------------------------------------------------------

    def phase(self, name: str) -> PhaseScope:
        # Only str names are cached: others may be unhashable, or objects we must not keep.
        scope = self._scopes.get(name) if name.__class__ is str else None
        if scope is None:
            scope = PhaseScope(self, _clean_name(name))
            if name.__class__ is str and len(self._scopes) < 10_000:
                self._scopes[name] = scope
        return scope

    def step(self, samples: int | None = None, tokens: int | None = None) -> StepScope:
        return StepScope(self, _count(samples), _count(tokens))

    # -- the deferred log ------------------------------------------------------------

    @property
    def debug(self) -> DebugHooks | None:
        return self._debug

    @debug.setter
    def debug(self, hooks: DebugHooks | None) -> None:
        # Debugging components act at step boundaries on the training thread (a profiler
        # starts there, a snapshot window opens there): no deferral while one is on.
        with self._lock:
            self._settle()
            self._debug = hooks
            self._defer = self._may_defer()

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
            self._defer = self._may_defer()

    def _may_defer(self) -> bool:
        return not self._want_cuda and self._debug is None and self._flop_probe is None

    @property
    def current_step(self) -> OpenStep | None:
        """The open step, after every deferred boundary has been applied (the lock waits
        for a drain in progress: its entries are off the log but not yet applied)."""
        if self._log or self._raw_out():
            self.settle()
        with self._lock:
            return self._current

    @property
    def pending(self) -> collections.deque[OpenStep]:
        """Finished steps waiting for the worker (deferred boundaries applied first)."""
        if self._log or self._raw_out():
            self.settle()
        return self._pending

    @property
    def finished(self) -> collections.deque[OpenStep]:
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

    def backlog_due(self) -> bool:
        """Whether enough waits for the worker to process before its next batch time:
        a quarter of the log's or of the finished steps' bound (read without the lock)."""
        return len(self._log) >= MAX_LOG // 4 or len(self._pending) >= self.max_pending // 4

    def settle(self) -> None:
        """Apply every deferred boundary, in the order the hooks logged them.

        In slices, so that a training thread waiting for the lock (an explicit phase
        beside an instrumented loop) waits for one slice, not for the whole backlog.
        """
        while self._log or self._raw_out():
            with self._lock:
                self._settle(SETTLE_SLICE)

    def _raw_out(self) -> bool:
        """Whether entries went to the sidecar unapplied here (sidecar/raw.py)."""
        return self.handover is not None and bool(self.handover.raw)

    def _catch_up(self) -> None:
        """Apply here what went to the sidecar unapplied (the lock is held)."""
        if self._raw_out():
            self.handover.leave_raw()

    def on_backlog(self, take: Any, entries: int, steps: int) -> None:
        """Call ``take()`` (on the recording thread, with no lock held) once the log holds
        more than ``entries`` entries or ``steps`` finished steps wait: how a feeder in
        this process hands work on without a thread of its own (otel_train/sidecar/)."""
        self._log_limit = entries
        self._steps_limit = steps
        self._on_full = take

    def _take_due(self) -> None:
        self._due = False
        self._on_full()

    def drain_blocks(self, keep_partial: bool = False) -> list[tuple[list[OpenStep], StepBlock]]:
        """Apply the log, taking runs of recognised steps as blocks (recording/blocks.py).

        Returns ``(steps finished before the block, block)`` pairs in order; steps
        finished after the last block stay in ``pending``. Normally the worker's call.
        ``keep_partial``: a log that ends inside a step of a known shape keeps that
        step's entries for the next call (the sidecar's feeder drains every few steps:
        replaying the partial step, or learning from it, would cost more than the rest).
        """
        out: list[tuple[list[OpenStep], StepBlock]] = []
        if not self._log or not self._defer or not self.blocks:
            return out
        with self._lock:
            self._catch_up()
            log = self._log
            # Entries the training thread appends meanwhile wait for the next call. (Those
            # taken here are applied before the lock is released: current_step waits.)
            entries = list(islice(iter(log.popleft, None), len(log)))
            n = len(entries)
            kinds: list[Any] = []
            stacks: list[Any] = []
            templates = self._templates
            i = 0
            try:
                while i < n:
                    item = entries[i]
                    if item[2].__class__ is tuple:  # an adapter boundary: a step may begin
                        stack = item[0]
                        if self._current is None and not stack and self.enabled:
                            if not kinds:
                                kinds = list(map(KIND, entries))
                                stacks = list(map(STACK, entries))
                            if keep_partial and self._partial_at(kinds, stacks, i, templates):
                                log.extendleft(reversed(entries[i:]))
                                return out
                            k, tpl = self._block_at(entries, kinds, stacks, i, templates)
                            if k:
                                assert tpl is not None
                                run = entries[i : i + k * tpl.m]
                                block = StepBlock(tpl, run, self._next_index)
                                out.append((list(self._pending), block))
                                for p in tpl.loose:  # scalars recorded between steps
                                    for e in run[p :: tpl.m]:
                                        self.loose_scalars.extend(e[3])
                                self._pending.clear()
                                self._next_index += k
                                if tpl.mode != CYCLE:
                                    self.step_stack = stack
                                i += k * tpl.m
                                continue
                    self._replay(item)
                    i += 1
            except Exception:
                log.clear()
                self._fail()
        return out

    @staticmethod
    def _partial_at(
        kinds: list[Any], stacks: list[Any], i: int, templates: dict[Boundary, list[Template]]
    ) -> bool:
        """Whether entries ``i`` .. the end are the beginning of one step of a known shape."""
        rest = len(kinds) - i
        for tpl in templates.get(kinds[i]) or ():
            if rest < tpl.m and kinds[i:] == tpl.kinds[:rest]:
                run = stacks[i:]
                return run.count(stacks[i]) == rest
        return False

    def _block_at(
        self,
        entries: list[tuple[Any, ...]],
        kinds: list[Any],
        stacks: list[Any],
        i: int,
        templates: dict[Boundary, list[Template]],
    ) -> tuple[int, Template | None]:
        """Whole recognised steps from entry ``i`` (the recorder is idle): (count, shape)."""
        stack = stacks[i]
        known = templates.get(kinds[i])
        best, best_tpl = 0, None
        for tpl in known or ():
            k = tpl.match(kinds, stacks, i, stack)
            if k * tpl.m > best * (best_tpl.m if best_tpl else 0):
                best, best_tpl = k, tpl
        if best > 1 or (best and i + best * best_tpl.m == len(kinds)):  # type: ignore[union-attr]
            return best, best_tpl
        # None, or one step and more after it: a longer shape may fit (scalars recorded
        # after each step, say). Learning is bounded: 8 shapes, 64 failed attempts.
        if self._template_misses >= 64 or (known and len(known) >= MAX_TEMPLATES):
            return best, best_tpl
        learned = self._learn(entries, kinds, stacks, i)
        if learned is None:
            return best, best_tpl
        if any(t.kinds == learned.kinds for t in known or ()):
            self._template_misses += 1  # the shape is known: it just did not repeat here
            return best, best_tpl
        templates.setdefault(kinds[i], []).append(learned)
        k = learned.match(kinds, stacks, i, stack)
        if k * learned.m > best * (best_tpl.m if best_tpl else 0):
            return k, learned
        return best, best_tpl

    def _learn(
        self, entries: list[tuple[Any, ...]], kinds: list[Any], stacks: list[Any], i: int
    ) -> Template | None:
        """Replay entries from ``i`` on a scratch recorder, positions for times, until it
        is idle again: the step's shape if exactly one step opened and closed."""
        stack = stacks[i]
        end = i
        limit = min(len(entries), i + MAX_TEMPLATE)
        while (
            end < limit
            and stacks[end] is stack
            and (kinds[end].__class__ is tuple or kinds[end] == SCALARS)
        ):
            end += 1  # the run of this thread's boundaries and scalars: a step must fit in it
        if end - i >= 2:
            scratch = Recorder(self.settings)
            scratch._defer = False
            scratch_stack: list[Any] = []
            counts: list[int] = []
            scalars: list[int] = []
            for j in range(i, end):
                kind, pos = kinds[j], j - i
                if kind.__class__ is not tuple:  # user scalars, inside the step
                    scalars.append(pos)
                    continue
                scratch._transition_at(scratch_stack, pos, kind[0], kind[1], kind[2], kind[3])
                current = scratch._current
                if kind[4] and current is not None and current.mode == ADAPTER:
                    counts.append(pos)
                if scratch._pending:
                    step = scratch._pending[0]
                    if (
                        current is not None
                        or scratch_stack
                        or len(scratch._pending) != 1
                        or scratch.dropped_phases
                        or not scratch.enabled
                        or step.error
                        or (scalars and scalars[0] < step.t0)  # scalars before the step began
                    ):
                        break
                    last = j + 1
                    while last < end and kinds[last] == SCALARS:
                        last += 1  # recorded after the step: loose, like the replay's
                    if last == len(entries):
                        return None  # more may follow: try again next time
                    rows = sorted((p[0], p[1], p[2], p[3], p[4]) for p in step.phases)
                    loose = tuple(range(j + 1 - i, last - i))
                    return Template(kinds[i:last], step.t0, step.t1, rows, tuple(counts),
                                    step.mode, tuple(scalars), loose)  # fmt: skip
        if end == len(entries):
            return None  # the log ends inside the step: try again next time
        self._template_misses += 1
        return None

    def _settle(self, limit: int = -1) -> None:
        """Apply deferred boundaries (all of them unless ``limit``); the lock is held."""
        self._catch_up()  # the state first: what the sidecar was sent raw
        log = self._log
        popleft = log.popleft
        replay = self._replay
        try:
            while log:
                # Entries appended meanwhile wait for the next pass (or the next call).
                count = len(log) if limit < 0 else min(limit, len(log))
                for _ in range(count):
                    replay(popleft())
                if limit >= 0:
                    return
        except Exception:
            log.clear()
            self._fail()

    def _replay(self, item: tuple[Any, ...]) -> None:
        """Apply one logged entry: ``(stack, t, kind, ...)``."""
        kind = item[2]
        if kind.__class__ is tuple:  # an adapter boundary
            self._transition_at(item[0], item[1], kind[0], kind[1], kind[2], kind[3])
            if kind[4] and (item[3] is not None or item[4] is not None):
                self._adapter_counts(item[3], item[4])
        else:
            self._apply(item, kind)

    def _apply(self, item: tuple[Any, ...], kind: int) -> None:
        """A logged entry other than an adapter boundary: ``(stack, t, kind, ...)``, or
        ``(None, 0, kind, ...)`` for what needs no time."""
        if kind == ENTER:  # (stack, t, ENTER, name)
            self._enter_at(item[3], item[1], item[0])
        elif kind == EXIT:  # (stack, t, EXIT, name, error)
            self._exit_at(item[1], item[0], item[4], item[3])
        elif kind == STEP_BEGIN:  # (stack, t, STEP_BEGIN, samples, tokens)
            self._scoped_begin_at(item[1], item[3], item[4], item[0])
        elif kind == STEP_END:  # (stack, t, STEP_END)
            self._scoped_end_at(item[1])
        elif kind == SCALARS:  # (stack, 0, SCALARS, [(name, value)])
            self._add_scalars(item[3])
        elif kind == COUNTS:  # (None, 0, COUNTS, samples, tokens): a batch's counts
            self._adapter_counts(item[3], item[4])
        else:  # (None, 0, DISCARD, name): an exhausted loader's step
            self._discard_if_only(item[3])

    def _append(self, item: tuple[Any, ...]) -> None:
        log = self._log
        log.append(item)
        if len(log) > self._log_limit:  # hand them on (sidecar), or apply them here
            self._on_full()

    def _tls_stack(self) -> list[list[Any]]:
        tls = self._tls
        try:
            return tls.stack  # type: ignore[no-any-return]
        except AttributeError:
            tls.stack = PhaseStack()
            return tls.stack  # type: ignore[no-any-return]

    # -- steps -----------------------------------------------------------------------

    def _refresh_cuda(self) -> None:
        # Cheap re-check until CUDA shows up: we never create a CUDA context ourselves.
        if self._want_cuda and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            self._cuda = True
            if self.settings.memory and self.memory is None:
                self.memory = CudaMemoryTracker(self.settings.reset_peak_memory)

    def begin_step(
        self, mode: int, samples: int | None = None, tokens: int | None = None
    ) -> OpenStep | None:
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

    def _begin_at(
        self,
        mode: int,
        t: int,
        samples: int | None = None,
        tokens: int | None = None,
        stack: list[list[Any]] | None = None,
    ) -> OpenStep | None:
        """Open a step at ``t``; ``stack`` is the phase stack of the thread opening it."""
        if not self.enabled:
            return None
        try:
            current = self._current
            if current is not None:
                if mode == EXPLICIT and current.mode == EXPLICIT:
                    return None  # nested explicit step: the outer one stands
                if (
                    mode == EXPLICIT
                    and current.mode == ADAPTER
                    and not stack
                    and all(p[2] in HOST_PHASES for p in current.phases)
                ):
                    # ``for batch in loader: with step():`` -- the instrumented loader's
                    # fetch opened this step; it belongs to the user's step, not a step of its own.
                    current.mode = EXPLICIT
                    if samples is not None or tokens is not None:
                        current.samples, current.tokens = samples, tokens
                    return current
                self._close(current, t)
            if self._want_cuda and not self._cuda:
                self._refresh_cuda()
            if self._cuda:
                step = OpenStep(self._next_index, t, mode, self.events.record(),
                                torch.cuda.current_device())  # fmt: skip
            else:
                step = OpenStep(self._next_index, t, mode, None, None)
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

    # Scoped explicit steps (``with step():``, a method-map adapter's step method): their
    # ends pair with their begins, so a nested one neither opens nor ends a step.

    def step_begin(self, samples: int | None = None, tokens: int | None = None) -> None:
        if not self.enabled:
            self._disabled()
            return
        try:
            t = perf_counter_ns()
            if self._defer:
                self._append((self._tls_stack(), t, STEP_BEGIN, samples, tokens))
                return
            with self._lock:
                self._settle()
                self._scoped_begin_at(t, samples, tokens, self._tls_stack())
        except Exception:
            self._fail()

    def step_end(self) -> None:
        if not self.enabled:
            self._disabled()
            return
        try:
            t = perf_counter_ns()
            if self._defer:
                self._append((self._tls_stack(), t, STEP_END))
                return
            with self._lock:
                self._settle()
                self._scoped_end_at(t)
            if self._due:
                self._take_due()
        except Exception:
            self._fail()

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

    def end_step(self, mode: int) -> None:
        if not self.enabled:
            self._disabled()
            return
        try:
            t = perf_counter_ns()
            with self._lock:
                self._settle()
                step = self._current
                if step is None:
                    return
                if step.mode != mode and not (mode == ADAPTER and step.mode == CYCLE):
                    return  # an adapter's optimizer step also ends a step bare phases opened
                self._close(step, t)
            if self._due:
                self._take_due()
        except Exception:
            self._fail()

    def add_counts(self, samples: int | None, tokens: int | None) -> None:
        with self._lock:
            self._settle()
            step = self._current
            if step is not None:
                self._add_counts(step, samples, tokens)

    @staticmethod
    def _add_counts(step: OpenStep, samples: int | None, tokens: int | None) -> None:
        if samples is not None:
            step.samples = (step.samples or 0) + samples
        if tokens is not None:
            step.tokens = (step.tokens or 0) + tokens

    def data_fetched(self, t: int, samples: int | None, tokens: int | None) -> None:
        """A loader's fetch ended at ``t``: exit its ``data`` phase and add the batch's
        counts to the adapter step open then (one log entry instead of two)."""
        if not self.enabled:
            self._disabled()
            return
        try:
            if self._defer:
                self._append((self._tls_stack(), t, DATA_FETCHED, samples, tokens))
                return
            with self._lock:
                self._settle()
                self._transition_at(self._tls_stack(), t, "data", None, 0, 0)
                if samples is not None or tokens is not None:
                    self._adapter_counts(samples, tokens)
        except Exception:
            self._fail()

    def log_counts(self, samples: int | None, tokens: int | None) -> None:
        """Counts from the batch just fetched, for the adapter step open at this point."""
        if self._defer and self.enabled:
            self._append((None, 0, COUNTS, samples, tokens))
            return
        with self._lock:
            self._settle()
            self._adapter_counts(samples, tokens)

    def _adapter_counts(self, samples: int | None, tokens: int | None) -> None:
        """A batch's counts go to an adapter's step only: an explicit step carries the
        user's own counts."""
        step = self._current
        if step is not None and step.mode == ADAPTER:
            self._add_counts(step, samples, tokens)

    def discard_step_if_only(self, name: str) -> None:
        """Drop an adapter-opened step that holds nothing but ``name`` (an exhausted loader)."""
        if self._defer and self.enabled:  # logged like a boundary (at each epoch's end)
            self._append((None, 0, DISCARD, name))
            return
        with self._lock:
            self._settle()
            self._discard_if_only(name)

    def _discard_if_only(self, name: str) -> None:
        step = self._current
        if step is not None and step.mode == ADAPTER and all(p[2] == name for p in step.phases):
            self._current = None
            if step.index == self._next_index - 1:
                self._next_index -= 1  # keep step indices contiguous across epochs
            self._release_step(step)

    def _close(self, step: OpenStep, t1: int) -> None:
        if self._flop_probe is not None:
            self._flop_probe.end(step, t1)
        step.t1 = t1
        step.ev1 = self.events.record() if step.ev0 is not None else None
        step.closed = True
        self._current = None
        if self._debug is not None:
            self._debug.step_ended(step.index)
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

    def _release_step(self, step: OpenStep) -> None:
        ev = self.events
        ev.release(step.ev0)
        ev.release(step.ev1)
        for p in step.phases:
            ev.release(p[5])
            ev.release(p[6])

    # -- phases ----------------------------------------------------------------------

    def enter(self, name: str) -> None:
        if not self.enabled:
            self._disabled()
            return
        try:
            if self._defer:
                self._append((self._tls_stack(), perf_counter_ns(), ENTER, name))
                return
            t = perf_counter_ns()
            with self._lock:
                self._settle()
                self._enter_at(name, t, self._tls_stack())
            if self._due:
                self._take_due()
        except Exception:
            self._fail()

    def _enter_at(self, name: str, t: int, stack: list[list[Any]]) -> None:
        if not self.enabled:
            return
        try:
            step = self._current
            if step is None or (step.top is not None and not stack):
                step = self._enter_top(name, step, t, stack)
                if step is None:
                    return
            if self._cuda:
                ev = self.events.record() if name not in HOST_PHASES else None
                r0 = o0 = 0
                mem = self.memory
                if mem is not None:
                    pa, pr, r0, o0 = mem.sample()
                    _fold_peaks(stack, pa, pr)
            else:
                ev = None
                r0 = o0 = 0
            seq = step.seq
            step.seq = seq + 1
            if stack:
                if len(stack) >= MAX_STACK:
                    raise RuntimeError("phase nesting deeper than 8192: enter/exit mismatch?")
                top = stack[-1]
                stack.append(
                    [name, seq, top[1] if top[5] is step else -1, t, ev, step, 0, 0, r0, o0]
                )
            else:
                stack.append([name, seq, -1, t, ev, step, 0, 0, r0, o0])
        except Exception:
            self._fail()

    def _enter_top(
        self, name: str, step: OpenStep | None, t: int, stack: list[list[Any]]
    ) -> OpenStep | None:
        """A top-level phase: open a cycle step if none, or start the next cycle."""
        if step is None:
            if self.step_stack is not None and self.step_stack is not stack:
                # Between another thread's steps: belongs to no step, and opens none.
                self.dropped_phases += 1
                return None
            step = self._begin_at(CYCLE, t, stack=stack)
        elif step.top is not None and name in step.top:
            self._close(step, t)  # the name repeats: a new cycle begins here
            step = self._begin_at(CYCLE, t, stack=stack)
        if step is not None and step.top is not None:
            step.top.add(name)
        return step

    def exit(self, exc_type: Any = None, exc: Any = None, name: str | None = None) -> None:
        if not self.enabled:
            self._disabled()
            return
        try:
            t = perf_counter_ns()
            error = self._describe(exc_type, exc) if exc_type is not None else None
            if self._defer:
                self._append((self._tls_stack(), t, EXIT, name, error))
                return
            with self._lock:
                self._settle()
                self._exit_at(t, self._tls_stack(), error, name)
            if self._due:
                self._take_due()
        except Exception:
            self._fail()

    def _describe(self, exc_type: Any, exc: Any) -> tuple[Any, ...]:
        error = describe_exception(exc_type, exc)
        if self._debug is not None:
            error += (self._debug.phase_error(exc),)  # the OOM snapshot's path, if any
        return error

    def _exit_at(
        self,
        t: int,
        stack: list[list[Any]],
        error: tuple[Any, ...] | None = None,
        name: str | None = None,
    ) -> None:
        """Exit the innermost phase (or ``name`` and what an adapter opened inside it);
        ``error`` is the exception it ended with, already described."""
        if not self.enabled:
            return
        try:
            if not stack:
                return
            if name is not None and stack[-1][0] != name and any(e[0] == name for e in stack):
                # Phases an adapter opened inside this one (the model's inferred forward)
                # end with it; popping the wrong entry would leak this one on the stack.
                while stack and stack[-1][0] != name and self.enabled:
                    self._exit_at(t, stack)
                if not stack or not self.enabled:
                    return
            entry = stack[-1]
            step = entry[5]
            ev = self.events.record() if entry[4] is not None else None
            memory = None
            mem = self.memory
            if mem is not None:
                pa, pr, r, o = mem.sample()
                _fold_peaks(stack, pa, pr)
                memory = (entry[6], entry[7], r - entry[8], o - entry[9])
            stack.pop()
            if step.closed:
                # The step ended (another thread or an adapter) while this phase ran.
                self.dropped_phases += 1
                self.events.release(entry[4])
                self.events.release(ev)
                return
            if error is not None:
                step.error = True
            t0 = entry[3]
            # Host seconds; a phase with events gets its device seconds on the worker.
            seconds = (t - t0) / 1e9 if t > t0 else 0.0
            step.phases.append(
                (entry[1], entry[2], entry[0], t0, t, entry[4], ev, memory, error, seconds)
            )
        except Exception:
            self._fail()

    def transition(self, b: Boundary) -> None:
        """An adapter hook's whole work in one call, at one timestamp: boundary ``b``
        (see :func:`boundary`).

        Without CUDA the call only logs ``b`` with the time and this thread's phase stack
        (see the module docstring); with CUDA, events and memory figures must be taken at
        the boundary itself, so it runs at once.
        """
        if not self.enabled:
            self._disabled()
            return
        try:
            if self._defer:
                tls = self._tls
                try:
                    stack = tls.stack
                except AttributeError:
                    stack = tls.stack = PhaseStack()
                log = self._log
                log.append((stack, perf_counter_ns(), b))
                if len(log) > self._log_limit:  # hand them on (sidecar), or apply them here
                    self._on_full()
                return
            t = perf_counter_ns()
            with self._lock:
                self._settle()
                self._transition_at(self._tls_stack(), t, b[0], b[1], b[2], b[3])
            if self._due:
                self._take_due()
        except Exception:
            self._fail()

    def _transition_at(
        self,
        stack: list[list[Any]],
        t: int,
        close: str | None,
        open_: str | None,
        begin: int,
        end: int,
    ) -> None:
        if not self.enabled:
            return
        try:
            if close is not None and stack and stack[-1][0] == close:
                if self._cuda:
                    self._exit_at(t, stack)
                else:
                    entry = stack.pop()
                    owner = entry[5]
                    if owner.closed:
                        self.dropped_phases += 1
                    else:
                        t0 = entry[3]
                        owner.phases.append((entry[1], entry[2], close, t0, t, None, None, None,
                                             None, (t - t0) / 1e9 if t > t0 else 0.0))  # fmt: skip
            step = self._current
            if (
                end
                and step is not None
                and (step.mode == end or (end == ADAPTER and step.mode == CYCLE))
            ):
                self._close(step, t)
                step = None
            if open_ is None:
                return
            if step is None:
                if not begin:
                    return  # a boundary outside any step (evaluation, a stray backward)
                step = self._begin_at(begin, t, stack=stack)
                if step is None:
                    return
            if self._cuda or (step.top is not None and not stack):
                self._enter_at(open_, t, stack)  # the general path: events, memory, cycles
                return
            seq = step.seq
            step.seq = seq + 1
            parent = stack[-1][1] if stack and stack[-1][5] is step else -1
            stack.append([open_, seq, parent, t, None, step, 0, 0, 0, 0])
        except Exception:
            self._fail()

    def exit_if_top(self, name: str, exc_type: Any = None, exc: Any = None) -> bool:
        """Exit the innermost open phase if it is ``name`` (adapters' inferred boundaries)."""
        try:
            t = perf_counter_ns()
            with self._lock:
                self._settle()
                stack = self._tls_stack()
                if stack and stack[-1][0] == name:
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
                return [e[0] for e in self._tls_stack()]
        except Exception:
            self._fail()
            return []

    # -- user scalars ------------------------------------------------------------------

    def record_scalars(self, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        try:
            items = []
            names = self._scalar_names  # (set operations are atomic under the GIL)
            for key, value in values.items():
                name = _clean_name(key)
                if name not in names:
                    if len(names) >= MAX_SCALAR_NAMES:
                        self.dropped_scalars += 1  # bounded series: new names past the cap
                        continue
                    names.add(name)
                item = _scalar_value(value, self.events)
                if item is not None:
                    items.append((name, item))
            if not items:
                return
            if self._defer:  # (with this thread's stack: a recognised step may hold it)
                self._append((self._tls_stack(), 0, SCALARS, items))
                return
            with self._lock:
                self._settle()
                self._add_scalars(items)
        except Exception:
            self._fail()

    def _add_scalars(self, items: list[tuple[str, Any]]) -> None:
        """Scalars belong to the step open when they were recorded (else they stand alone)."""
        step = self._current
        if step is not None:
            if step.scalars is None:
                step.scalars = []
            step.scalars.extend(items)
        else:
            self.loose_scalars.extend(items)

    # -- failure --------------------------------------------------------------------

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


def _fold_peaks(stack: list[list[Any]], peak_allocated: int, peak_reserved: int) -> None:
    """Hand the allocator's peak since the last boundary to every phase open now."""
    for e in stack:
        if peak_allocated > e[6]:
            e[6] = peak_allocated
        if peak_reserved > e[7]:
            e[7] = peak_reserved


def _clean_name(name: Any) -> str:
    text = name if isinstance(name, str) else str(name)
    text = text[:MAX_NAME]
    return text or "unnamed"


def _count(value: Any) -> int | None:
    """A sample/token count, or None: never a device read, never beyond int64 (OTLP)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and (value.device.type != "cpu" or value.numel() != 1):
        return None  # int() of a CUDA tensor would synchronise; meta tensors hold no value
    try:
        number = int(value)
    except Exception:
        return None
    return number if 0 <= number <= _INT64_MAX else None


def _scalar_value(value: Any, events: EventPool) -> Any:
    """A float, or ``(pinned CPU tensor, event)`` being filled from the device (no sync)."""
    if isinstance(value, bool):
        return float(value)
    if type(value) is float:
        return value
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex() or value.is_meta:
            return None
        t = value.detach()
        if t.is_cuda:
            host = torch.empty((), dtype=torch.float64, pin_memory=True)
            host.copy_(t.reshape(()), non_blocking=True)
            return (host, events.record())
        if t.device.type != "cpu":
            return None  # other devices (mps, xla, ...) would be read synchronously
        value = t.item()
    try:
        return float(value)
    except Exception:  # complex, huge ints, strings: not a scalar we can chart
        return None
