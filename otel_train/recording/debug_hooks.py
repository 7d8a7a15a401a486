"""The debugging components (profiler window, memory snapshot) hooked at step boundaries.

The recorder holds ``debug = None`` unless a component is switched on, so a run
without them pays one ``is None`` check per step boundary. The components live in
``otel_train.debug`` and work without otel-train too; this module only forwards the
recorder's step boundaries and phase errors to them, and their span events to the
span emitter (spans are built after the fact, so events travel by step index).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from .. import identity
from ..debug.memory_snapshot import MemorySnapshot
from ..debug.profiler_window import ProfilerWindow
from ..settings import ConfigError, Settings

_log = logging.getLogger("otel_train")


class DebugHooks:
    """Every switched-on component; each call is guarded and never raises."""

    def __init__(self, profiler: ProfilerWindow | None, snapshot: MemorySnapshot | None) -> None:
        self.profiler = profiler
        self.snapshot = snapshot
        self._failed = False
        # Called (the recorder's lock held) when acts_from() changes at a step's end:
        # the recorder defers its log again once a window has passed.
        self.moved: Callable[[], None] | None = None
        self._acts = self.acts_from()

    def step_started(self, index: int) -> None:
        try:
            if self.profiler is not None:
                self.profiler.step_started(index)
            if self.snapshot is not None:
                self.snapshot.step_started(index)
        except Exception:
            self._fail()

    def step_ended(self, index: int) -> None:
        try:
            if self.profiler is not None:
                self.profiler.step_ended(index)
            if self.snapshot is not None:
                self.snapshot.step_ended(index)
        except Exception:
            self._fail()
        acts = self.acts_from()
        if acts != self._acts:
            self._acts = acts
            if self.moved is not None:
                self.moved()

    def phase_error(self, exc: BaseException | None) -> str | None:
        """The snapshot path when ``exc`` is a CUDA OOM seen for the first time."""
        try:
            return None if self.snapshot is None else self.snapshot.handle_error(exc)
        except Exception:
            self._fail()
            return None

    def acts_from(self) -> int | None:
        """The first step index at whose boundaries a component still acts on the training
        thread (-1: at every one, now), or None when none will (the recorder defers its
        log while that step is far enough ahead: recording/deferred.py)."""
        try:
            components = (self.profiler, self.snapshot)
            starts = [c.acts_from() for c in components if c is not None]
            return min((s for s in starts if s is not None), default=None)
        except Exception:
            self._fail()
            return None

    def step_events(self, index: int) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        try:
            if self.profiler is not None:
                out += self.profiler.events_for(index)
            if self.snapshot is not None:
                out += self.snapshot.events_for(index)
        except Exception:
            self._fail()
        return out

    def close(self) -> None:
        try:
            if self.profiler is not None:
                self.profiler.close()
            if self.snapshot is not None:
                self.snapshot.close()
        except Exception:
            self._fail()

    def _fail(self) -> None:
        self.profiler = self.snapshot = None
        if not self._failed:
            self._failed = True
            _log.exception("otel-train: a debugging component failed; debugging is off")


def build_debug_hooks(settings: Settings) -> DebugHooks | None:
    """The components the settings switch on, or None (the hot path's single check)."""
    profiler = None
    if settings.profile_steps is not None:
        first, last = settings.profile_steps
        profiler = ProfilerWindow(
            first, last, settings.debug_dir, link_current_span=False, rank=identity.rank()
        )
    snapshot = None
    mode = settings.memory_snapshot
    if mode != "off":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"otel_train setting 'memory_snapshot' is {mode!r} but CUDA is not available; "
                "accepted values without CUDA: 'off'"
            )
        window = None if mode == "oom" else _window(mode)
        snapshot = MemorySnapshot(
            settings.debug_dir, steps=window, on_oom=window is None, rank=identity.rank()
        )
    if profiler is None and snapshot is None:
        return None
    return DebugHooks(profiler, snapshot)


def _window(mode: str) -> tuple[int, int]:
    first, _, last = mode.partition("-")
    return int(first), int(last or first)
