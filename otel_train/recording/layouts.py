"""The layouts the recording core passes around: open steps, stack entries, phase rows
and deferred-log entries.

The hot path builds plain lists and tuples, not objects, because a tuple costs the
training thread less than an instance with attributes; the price is fields read by
position. The index constants below name those positions once, for the recorder and for
whoever reads its rows (the worker, the sidecar, processing/blocks.py), so that a
slot's meaning is looked up here rather than inferred from a bare number.
"""

from __future__ import annotations

import sys
import threading
import traceback
import weakref
from typing import TYPE_CHECKING, Any

from .scopes import B_END, CYCLE, MAX_MESSAGE

if TYPE_CHECKING:
    from .links import StepLink
    from .tokens import Consumed

# A phase stack entry (a list, mutated while the phase is open):
# [name, seq, parent seq (-1: none), host t0, start event, the step it belongs to,
#  peak allocated and peak reserved bytes so far, alloc retries and OOMs at entry]
(S_NAME, S_SEQ, S_PARENT, S_T0, S_EV0, S_STEP, S_PEAK_ALLOCATED, S_PEAK_RESERVED, S_RETRIES,
 S_OOMS) = range(10)  # fmt: skip

# A finished phase's row (a tuple in Step.phases):
# (seq, parent seq, name, host t0, host t1, start event or device t0, end event or device
#  t1, memory figures or None, described error or None, seconds)
(P_SEQ, P_PARENT, P_NAME, P_T0, P_T1, P_EV0, P_EV1, P_MEMORY, P_ERROR,
 P_SECONDS) = range(10)  # fmt: skip
# A row's memory figures (P_MEMORY): peak allocated and peak reserved bytes, allocator
# retries and OOMs while it ran.
M_ALLOCATED, M_RESERVED, M_RETRIES, M_OOMS = range(4)
# A row's described error (P_ERROR, describe_exception): the exception's type name, its
# message, the formatted stack, (allocated, reserved, total) bytes for a CUDA OOM or None,
# and, when a debugging component is on, the OOM snapshot's path or None.
E_TYPE, E_MESSAGE, E_STACK, E_OOM, E_SNAPSHOT = range(5)

# A deferred-log entry: ``(stack, time, kind, ...)``; what follows ``kind`` depends on it.
L_STACK, L_TIME, L_KIND = range(3)
# An adapter boundary's kind is the boundary itself (a tuple from ``scopes.boundary()``);
# the other kinds are these (their payloads are listed in DeferredLog._replay).
ENTER, EXIT, STEP_BEGIN, STEP_END, SCALARS, COUNTS, DISCARD, LINK, ENTER_REMOTE = range(9)
# Payload positions read outside the replay: a counted boundary's and a COUNTS entry's
# samples, tokens and padded tokens; a SCALARS entry's list of (name, value).
L_SAMPLES, L_TOKENS, L_PADDED = 3, 4, 5
L_SCALARS = 3


def step_ends(entries: Any) -> int:
    """How many steps ``entries`` end, by their kinds alone (nothing applied): a step's
    end, or an adapter boundary that ends one (``boundary(..., end=mode)``)."""
    kinds = [e[L_KIND] for e in entries]
    return sum(1 for k in kinds if k == STEP_END or (k.__class__ is tuple and k[B_END]))


def newest_time(entries: Any, last: int | None = None) -> int:
    """The time of the newest timed entry among the first ``last`` of ``entries`` (all:
    None); entries without one (scalars, counts) say 0. Looks at eight at most."""
    end = len(entries) if last is None else last
    for i in range(end - 1, max(-1, end - 9), -1):
        t = entries[i][L_TIME]
        if t:
            return int(t)
    return 0


class PhaseStack(list):  # type: ignore[type-arg]
    """A thread's phase stack; equal only to itself (the worker counts a thread's
    entries in a log by comparing stacks, and two threads' empty stacks are not one)."""

    __slots__ = ("__weakref__", "thread")  # (kept weakly: PeakStacks; its thread)
    thread: int  # the ident of the thread it belongs to (0: another process's)
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__  # type: ignore[assignment]


class MainPhaseStack(PhaseStack):
    """The main thread's stack: before any step has opened, only its bare phases open
    steps (another thread's are background phases, see PhaseMachine._enter_at)."""

    __slots__ = ()


def new_stack() -> PhaseStack:
    """A phase stack for the calling thread (``thread``: its ident, for hang records)."""
    stack = (
        MainPhaseStack() if threading.current_thread() is threading.main_thread() else PhaseStack()
    )
    stack.thread = threading.get_ident()
    return stack


class Step:
    """A step: the one object from the state machine to its span.

    The state machine (machine.py) fills it as the log is applied: its host times
    ``t0``/``t1``, its phase rows (``phases``, P_SEQ ... P_SECONDS, holding CUDA events
    while open), its counts, scalars and links. Once finished it is resolved where it
    stands (processing/resolved.py): events placed on the host clock in the same row
    positions, scalars read off the device, and the figures below derived; every
    consumer reads it in a block of steps (processing/blocks.py), and a traced step's
    span is built from it."""

    __slots__ = (
        "closed",
        "consumed",
        "dev_end",
        "dev_start",
        "device",
        "device_seconds",
        "efficiency",
        "end",
        "error",
        "ev0",
        "ev1",
        "events",
        "host_seconds",
        "index",
        "link",
        "mode",
        "padded",
        "phases",
        "sampled_because",
        "samples",
        "scalars",
        "seq",
        "start",
        "t0",
        "t1",
        "tokens",
        "top",
    )
    # Set when it is resolved (processing/resolved.py), read only after that:
    host_seconds: float
    dev_start: int | None  # device start and end, placed on the host clock
    dev_end: int | None
    device_seconds: float | None
    start: int  # the span's extent: host and device times together
    end: int
    efficiency: Any  # processing/blocks.StepEfficiency, for a traced step
    sampled_because: str  # why it was traced (processing/sampling.py)

    def __init__(self, index: int, t0: int, mode: int, ev0: Any, device: int | None) -> None:
        self.index = index
        self.t0 = t0
        self.t1 = 0
        self.mode = mode
        self.ev0 = ev0
        self.ev1: Any = None
        self.samples: int | None = None
        self.tokens: int | None = None
        self.padded: int | None = None  # tokens padding included, if an adapter counted
        # Rows (see P_SEQ ...): the worker's rows as they are when the phase has no
        # events (the CPU case)
        self.phases: list[tuple[Any, ...]] = []
        self.error = False  # a phase ended with an exception
        self.seq = 0
        self.top: set[str] | None = set() if mode == CYCLE else None
        self.scalars: list[tuple[str, Any]] | None = None
        self.closed = False
        self.device = device
        self.link: StepLink | None = None  # its place in a trace across processes
        self.consumed: list[Consumed] | None = None  # rollouts it consumed (tokens.py)
        # Its span's events from the debugging components (profiler trace, memory
        # snapshot), taken as it ends: they travel with the step wherever its span is built
        self.events: list[tuple[str, dict[str, Any]]] | None = None


def describe_exception(exc_type: type[BaseException], exc: BaseException | None) -> tuple[Any, ...]:
    """A small, frame-free description: keeping the exception would keep its frames alive."""
    message = str(exc)[:MAX_MESSAGE] if exc is not None else ""
    stack = "".join(traceback.format_exception(exc_type, exc, exc.__traceback__ if exc else None))
    oom = None
    torch = sys.modules.get("torch")  # (a CUDA OOM comes from a torch already imported)
    if (
        torch is not None
        and isinstance(exc, torch.cuda.OutOfMemoryError)
        and torch.cuda.is_available()
    ):
        try:
            oom = (
                int(torch.cuda.memory_allocated()),
                int(torch.cuda.memory_reserved()),
                int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory),
            )
        except Exception:  # telemetry must not mask the user's OOM
            oom = None
    return (exc_type.__qualname__, message, stack[-8192:], oom)


class PeakStacks:
    """Every thread's phase stack that has had a phase with memory figures, held weakly
    (a thread's stack goes with its thread). A dict of weak references by ``id``: per
    boundary, one dict lookup and one call per stack, where a ``WeakSet``'s membership
    test made a weak reference and its guarded iteration two Python frames."""

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}

    def fold(self, stack: list[list[Any]], peak_allocated: int, peak_reserved: int) -> None:
        """The allocator's peak since the last boundary (device-wide, reset device-wide),
        reached at a boundary on ``stack``'s thread, to every phase open now on any
        thread: a boundary on another thread must not take this thread's peak with it."""
        refs = self._refs
        key = id(stack)
        if key not in refs:  # (the callback runs as the stack is freed, before its id is reused)

            def gone(_: Any, key: int = key) -> None:
                refs.pop(key, None)

            refs[key] = weakref.ref(stack, gone)
        for ref in tuple(refs.values()):  # (a copy: a callback may pop meanwhile)
            s = ref()
            if s:
                fold_peaks(s, peak_allocated, peak_reserved)

    def __len__(self) -> int:
        return len(self._refs)


def fold_peaks(stack: list[list[Any]], peak_allocated: int, peak_reserved: int) -> None:
    """Hand the allocator's peak since the last boundary to every phase open now."""
    for e in stack:
        if peak_allocated > e[S_PEAK_ALLOCATED]:
            e[S_PEAK_ALLOCATED] = peak_allocated
        if peak_reserved > e[S_PEAK_RESERVED]:
            e[S_PEAK_RESERVED] = peak_reserved
