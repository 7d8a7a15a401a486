"""The handle ``instrument()`` returns, and the patching helpers every adapter uses
(among them the method-map timing of ``methods.py``, which torchtitan's builds on).

Every change an adapter makes is registered with an undo function; ``uninstrument()``
runs them in reverse order, exactly once, and leaves the target as it was.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, Protocol

from ..recording.notes import SummaryNotes
from ..recording.recorder import PhaseScope, Recorder, StepScope
from ..recording.regions import RegionLog
from .collectives import hold_collectives

_log = logging.getLogger("otel_train")


class SessionView(Protocol):
    """What adapters use of their session: session.py's Session, which they never import
    (the session is built without them; ``instrument()`` hands it to them)."""

    recorder: Recorder
    regions: RegionLog
    notes: SummaryNotes  # the run summary's lines from the adapters
    closed: bool

    @property
    def instrumentations(self) -> dict[int, Any]: ...

    def note_model(self, target: Any) -> None: ...


class Instrumentation:
    """A live instrumentation of one target; also a context manager (exit = uninstrument)."""

    def __init__(self, session: SessionView, target: Any, kind: str) -> None:
        self.session = session
        self.target = target
        self.kind = kind
        self._undo: list[Callable[[], None]] = []
        self.active = True
        self.rec = session.recorder
        self.on_undo(hold_collectives(self))  # (blocking collectives become phases)

    def on_undo(self, fn: Callable[[], None]) -> None:
        self._undo.append(fn)

    def uninstrument(self) -> None:
        if not self.active:
            return
        self.active = False
        while self._undo:
            fn = self._undo.pop()
            try:
                fn()
            except Exception:
                _log.exception("otel-train: restoring %s failed", self.kind)
        self.session.instrumentations.pop(id(self.target), None)

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.uninstrument()

    # Shortcuts to the session's recorder.
    def phase(self, name: str) -> PhaseScope:
        return self.session.recorder.phase(name)

    def step(self, samples: int | None = None, tokens: int | None = None) -> StepScope:
        return self.session.recorder.step(samples, tokens)

    def record(self, **scalars: Any) -> None:
        self.session.recorder.record_scalars(scalars)

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return f"<otel_train.Instrumentation {self.kind} of {type(self.target).__name__} ({state})>"


def guarded(inst: Instrumentation, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A hook that never raises into training: on error, log once and deactivate it."""
    state = {"ok": True}

    def hook(*args: Any, **kwargs: Any) -> Any:
        if not state["ok"]:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception:
            state["ok"] = False
            _log.exception("otel-train: a %s hook failed; that hook is now disabled", inst.kind)
            return None

    return hook


def note_precision(rec: Recorder, label: str | None) -> None:
    """The precision an adapter saw the forward run in (autocast's dtype, or the trainer's
    mixed-precision setting): MFU's peak when nothing counted the FLOPs (precision.py)."""
    if label and rec.precision_hint != label:
        rec.precision_hint = label


def patch_attribute(inst: Instrumentation, obj: Any, name: str, value: Any) -> None:
    """Set ``obj.name`` in the instance dict; undo restores the instance dict exactly."""
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, value)

    def undo() -> None:
        if had:
            setattr(obj, name, old)
        else:
            with contextlib.suppress(AttributeError):
                delattr(obj, name)

    inst.on_undo(undo)


def mark_region(inst: Instrumentation, obj: Any, name: str, kind: str) -> None:
    """Time each ``obj.name()`` call as a goodput region (``evaluation`` or ``checkpoint``),
    if ``obj`` has that method; undone with the instrumentation."""
    method = getattr(obj, name, None)
    if not callable(method):
        return
    regions = inst.session.regions

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not inst.active:
            return method(*args, **kwargs)
        with regions.region(kind):
            return method(*args, **kwargs)

    patch_attribute(inst, obj, name, wrapper)


def close_phases(rec: Recorder, names: tuple[str, ...], err: BaseException | None = None) -> None:
    """Exit the innermost open phases while they are among ``names`` (an adapter's own).

    Adapters infer boundaries from hooks; this closes what a skipped hook left open
    without ever popping a phase the user opened around or inside them.
    """
    et = type(err) if err is not None else None
    for _ in range(16):
        top = rec.open_phase_names()[-1:]
        if not top or top[0] not in names:
            return
        rec.exit(et, err)


def wrap_call(method: Any, enter: Any, exit_: Any) -> Any:
    """``method`` with ``enter()`` before each call and ``exit_(et, err)`` after it (async
    methods stay async)."""
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            enter()
            try:
                result = await method(*args, **kwargs)
            except BaseException as err:
                exit_(type(err), err)
                raise
            exit_(None, None)
            return result

        return async_wrapper

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        enter()
        try:
            result = method(*args, **kwargs)
        except BaseException as err:
            exit_(type(err), err)
            raise
        exit_(None, None)
        return result

    return wrapper


def time_methods(
    inst: Instrumentation, target: Any, phases: dict[str, tuple[str, ...]], step: str | None
) -> None:
    """Wrap each method named in ``phases`` in its phase and ``step`` (if any) in a step.

    The wrappers live in ``target``'s instance dict (undone with ``inst``); they time
    only while ``inst`` is active and never raise into the wrapped method's caller.
    """
    rec: Recorder = inst.session.recorder
    for phase, names in phases.items():
        for name in names:
            method = getattr(target, name)
            # guarded: an error in telemetry never reaches the wrapped method's caller
            enter = guarded(inst, functools.partial(_enter_if_active, inst, rec, phase))
            exit_ = guarded(inst, functools.partial(_exit_if_active, inst, rec, phase))
            patch_attribute(inst, target, name, wrap_call(method, enter, exit_))
    if step is not None:
        method = getattr(target, step)
        patch_attribute(
            inst,
            target,
            step,
            wrap_call(
                method,
                guarded(inst, functools.partial(_begin_if_active, inst, rec)),
                guarded(inst, functools.partial(_end_if_active, inst, rec)),
            ),
        )


def _enter_if_active(inst: Instrumentation, rec: Recorder, phase: str) -> None:
    if inst.active:
        rec.enter(phase)


def _exit_if_active(inst: Instrumentation, rec: Recorder, phase: str, et: Any, err: Any) -> None:
    if inst.active:
        rec.exit(et, err, phase)


def _begin_if_active(inst: Instrumentation, rec: Recorder) -> None:
    if inst.active:
        rec.step_begin()


def _end_if_active(inst: Instrumentation, rec: Recorder, et: Any, err: Any) -> None:
    if inst.active:
        rec.step_end()
