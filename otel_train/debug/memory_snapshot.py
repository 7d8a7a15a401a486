"""A CUDA memory snapshot: allocator history over a window of steps, or armed for OOM.

While armed, ``torch.cuda.memory._record_memory_history`` keeps the last
``max_entries`` allocator events with the Python stacks of allocations (``context="alloc"``:
no stacks for frees). On an out-of-memory error the allocator's OOM observer notes the
failed allocation; the snapshot is dumped to ``directory`` when the error reaches a
phase or ``guard()`` (its path is then added as an event to that span, otel-train's
innermost phase or the span current around ``guard()``, and the error continues to your
code unchanged), or at ``close()`` when it reached neither. An OOM that PyTorch catches
itself (cuDNN trying a smaller workspace) or that your code recovers from is followed by
the next step boundary with nothing dumped. At most ``max_dumps`` OOM snapshots are
written per process (loops that catch OOMs and retry smaller would otherwise write one
each time). A window (steps ``first`` to ``last``) dumps once when ``last`` ends. Open the
pickle at https://pytorch.org/memory_viz.

Standalone usage (imports only torch and the OTel API)::

    snap = MemorySnapshot("snapshots/", on_oom=True)
    snap.start()                          # CUDA must be initialised
    with tracer.start_as_current_span("forward"), snap.guard():
        out = model(batch)                # an OOM here is dumped, then re-raised
    snap.close()

Recording history costs allocator time and host memory (bounded by ``max_entries``):
it is a debugging aid, off by default. Errors inside it are logged once and switch it
off; they never reach the training loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch
from opentelemetry import trace

_log = logging.getLogger("otel_train")
_armed: MemorySnapshot | None = None  # the instance the process-wide OOM observer dumps for
_observer_attached = False

# Set on an OOM error once a phase or guard handled it (ids of dead errors are reused).
_SEEN = "_otel_train_snapshot_seen"
# Mirror otel_train.contract.MEMORY_SNAPSHOT_EVENT and its attributes (a test keeps them equal).
SNAPSHOT_EVENT = "otel_train.memory_snapshot"
SNAPSHOT_PATH = "otel_train.memory_snapshot.path"
SNAPSHOT_REASON = "otel_train.memory_snapshot.reason"


class MemorySnapshot:
    """Record CUDA allocator history for a step window and/or dump it on OOM."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        steps: tuple[int, int] | None = None,
        on_oom: bool = True,
        max_entries: int = 100_000,
        stacks: str = "python",
        max_dumps: int = 5,
        rank: int = 0,
    ) -> None:
        """``rank``: the process's rank, for the snapshot files' names."""
        if steps is not None and (steps[0] < 0 or steps[1] < steps[0]):
            raise ValueError(f"steps must be (first, last) with 0 <= first <= last, got {steps}")
        self.directory = Path(directory)
        self.steps = steps
        self.on_oom = on_oom
        self.max_entries = max_entries
        self.stacks = stacks  # "python" is cheaper per allocation than "all" (C++ frames too)
        self.max_dumps = max_dumps
        self.rank = rank
        self._oom_dumps = 0
        self._observed = False  # the allocator reported an OOM no phase or guard saw yet
        self.recoveries = 0  # OOMs followed by a step boundary: caught, nothing dumped
        self.recording = False
        self.failed = False
        self.paths: list[str] = []  # every snapshot written, in order
        self._window_path: str | None = None

    # -- recording ---------------------------------------------------------------------

    def start(self) -> bool:
        """Start recording history if CUDA is initialised; returns whether it records."""
        if self.recording or self.failed:
            return self.recording
        try:
            if not (torch.cuda.is_available() and torch.cuda.is_initialized()):  # type: ignore[no-untyped-call]
                return False
            torch.cuda.memory._record_memory_history(
                max_entries=self.max_entries,
                stacks=self.stacks,
                context="alloc",  # stacks of allocations only ("all" adds every free's)
            )
            self.recording = True
            _attach_observer(self)
        except Exception:
            self._fail()
        return self.recording

    def close(self) -> None:
        """Stop recording; an OOM the allocator reported that reached no phase or guard
        (and no step boundary followed) is dumped first."""
        global _armed
        if _armed is self:
            _armed = None
        if not self.recording:
            return
        if self._observed:
            self._observed = False
            if self._dump_allowed():
                self._oom_dumps += 1
                self.dump("oom")
        self.recording = False
        try:
            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            self._fail()

    def dump(self, reason: str) -> str | None:
        """Write the current snapshot; returns its path (None when not recording)."""
        if not self.recording or self.failed:
            return None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            rank, pid = self.rank, os.getpid()
            name = f"memory-{reason}-{len(self.paths)}.rank{rank}.pid{pid}.pickle"
            path = str((self.directory / name).resolve())
            torch.cuda.memory._dump_snapshot(path)  # type: ignore[no-untyped-call]
        except Exception:
            self._fail()
            return None
        self.paths.append(path)
        return path

    # -- step boundaries -----------------------------------------------------------------

    def step_started(self, index: int) -> None:
        """Arms at the first step that finds CUDA initialised (OOM) or at the window start."""
        self._recovered()
        if self.recording or self.failed:
            return
        window = self.steps
        if self.on_oom or (window is not None and window[0] <= index <= window[1]):
            self.start()

    def step_ended(self, index: int) -> None:
        self._recovered()
        window = self.steps
        if window is None or index != window[1] or self._window_path is not None:
            return
        self._window_path = self.dump("window") or ""
        if not self.on_oom:
            self.close()

    def acts_from(self) -> int | None:
        """The first step index whose boundaries this snapshot still acts at (see
        ProfilerWindow.acts_from): -1 while it records or watches for OOMs, the window's
        first step before the window, None when it is done."""
        if self.failed or (self.steps is None and not self.on_oom):
            return None
        if self.on_oom or self.recording:
            return -1
        return None if self._window_path is not None else self.steps[0]  # type: ignore[index]

    def events_for(self, index: int) -> list[tuple[str, dict[str, Any]]]:
        """The window snapshot's event for the last window step's span (after the fact)."""
        window = self.steps
        if window is None or index != window[1] or not self._window_path:
            return []
        return [self.event(self._window_path, "window")]

    # -- out of memory ---------------------------------------------------------------------

    def observed_oom(self) -> None:
        """The allocator's OOM observer calls this at the failed allocation: no dump here
        (the error may never reach your code: PyTorch catches some itself)."""
        self._observed = True

    def _recovered(self) -> None:
        """A step boundary after an observed OOM no phase saw: someone caught it."""
        if self._observed:
            self._observed = False
            self.recoveries += 1

    def _dump_allowed(self) -> bool:
        if self._oom_dumps < self.max_dumps:
            return True
        if self._oom_dumps == self.max_dumps:
            self._oom_dumps += 1
            _log.warning("otel-train: %d OOM snapshots written; no more", self.max_dumps)
        return False

    def handle_error(self, exc: BaseException | None) -> str | None:
        """The snapshot path for a CUDA OOM, once per error (its innermost handler)."""
        if not isinstance(exc, torch.cuda.OutOfMemoryError):
            return None
        if getattr(exc, _SEEN, False):
            return None  # an enclosing phase sees the same error: it is linked already
        with suppress(Exception):  # (an exception object that takes no attributes)
            setattr(exc, _SEEN, True)
        self._observed = False
        path = None
        if self.recording and self._dump_allowed():
            self._oom_dumps += 1
            path = self.dump("oom")
        return path

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Dump on an OOM raised inside, add the event to the current span, re-raise as is."""
        try:
            yield
        except torch.cuda.OutOfMemoryError as err:
            path = self.handle_error(err)
            if path is not None:
                try:
                    span = trace.get_current_span()
                    if span.is_recording():
                        name, attributes = self.event(path, "oom")
                        span.add_event(name, attributes)
                except Exception:
                    _log.exception("otel-train: attaching the memory snapshot event failed")
            raise

    @staticmethod
    def event(path: str, reason: str) -> tuple[str, dict[str, Any]]:
        return SNAPSHOT_EVENT, {SNAPSHOT_PATH: path, SNAPSHOT_REASON: reason}

    def _fail(self) -> None:
        self.failed = True
        _log.exception("otel-train: the CUDA memory snapshot failed; it is now off")
        if self.recording:
            self.recording = False
            with suppress(Exception):
                torch.cuda.memory._record_memory_history(enabled=None)


def _attach_observer(snapshot: MemorySnapshot) -> None:
    """Route the allocator's OOM observer (process-wide, cannot be removed) to ``snapshot``."""
    global _armed, _observer_attached
    _armed = snapshot
    if _observer_attached:
        return
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        return  # handle_error() dumps when the error reaches a phase or guard()
    attach(_observe_oom)
    _observer_attached = True


def _observe_oom(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    # Runs inside the allocator, just before OutOfMemoryError is raised: never raise here.
    try:
        snapshot = _armed
        if snapshot is not None:
            snapshot.observed_oom()
    except Exception:
        _log.exception("otel-train: dumping the memory snapshot at an OOM failed")
