"""A ``torch.profiler`` window over a chosen range of training steps.

The profiler starts when step ``first`` begins and stops when step ``last`` ends; the
trace (Chrome trace JSON, readable by Perfetto and TensorBoard) is written to
``directory``. Every covered step can carry a span event linking to that file.

Standalone usage (no otel-train session needed; imports only torch and the OTel API)::

    window = ProfilerWindow(10, 12, "traces/")
    for i, batch in enumerate(loader):
        with tracer.start_as_current_span("step"):
            window.step_started(i)      # adds the event to the current span when covered
            train_step(batch)
            window.step_ended(i)        # at step 12: stop and write the trace
    window.close()

Errors inside the profiler are logged once and switch the window off; they never
reach the training loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import torch
from opentelemetry import trace

_log = logging.getLogger("otel_train")

# Mirrors otel_train.contract.PROFILE_EVENT (a test keeps them equal).
PROFILE_EVENT = "otel_train.profile"
PROFILE_PATH = "otel_train.profile.path"
PROFILE_FIRST = "otel_train.profile.first_step"
PROFILE_LAST = "otel_train.profile.last_step"


def parse_steps(text: str) -> tuple[int, int]:
    """``"10-12"`` -> (10, 12); ``"7"`` -> (7, 7). Raises ValueError otherwise."""
    first, sep, last = text.strip().partition("-")
    a = int(first)
    b = int(last) if sep else a
    if a < 0 or b < a:
        raise ValueError(f"not a step range FIRST-LAST with 0 <= FIRST <= LAST: {text!r}")
    return a, b


class ProfilerWindow:
    """Profile steps ``first`` to ``last`` (inclusive) into one trace file."""

    def __init__(
        self,
        first: int,
        last: int,
        directory: str | os.PathLike[str],
        *,
        activities: list[Any] | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        link_current_span: bool = True,
        rank: int = 0,
    ) -> None:
        """``rank``: the process's rank, for the trace file's name."""
        if first < 0 or last < first:
            raise ValueError(f"need 0 <= first <= last, got first={first} last={last}")
        self.first = first
        self.last = last
        self.directory = Path(directory)
        name = f"profile-steps{first}-{last}.rank{rank}.pid{os.getpid()}.pt.trace.json"
        self.path = str((self.directory / name).resolve())
        if activities is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._options: dict[str, Any] = {
            "activities": activities,
            "record_shapes": record_shapes,
            "profile_memory": profile_memory,
            "with_stack": with_stack,
        }
        self._profiler: Any = None
        # Add the event to the span current at each covered step's start (standalone use);
        # otel-train builds its spans after the fact and asks events_for() instead.
        self.link_current_span = link_current_span
        self.done = False  # the trace was written (or the window failed): nothing more to do
        self.written = False

    def covers(self, index: int) -> bool:
        return self.first <= index <= self.last

    def acts_from(self) -> int | None:
        """The first step index whose boundaries this window still acts at: ``first``
        before it, -1 while the profiler runs, None once the trace is written (or the
        window failed). A recorder that applies boundaries later, on another thread,
        must apply them on the training thread from there on."""
        if self.done:
            return None
        return -1 if self._profiler is not None else self.first

    def step_started(self, index: int) -> None:
        """Call as each step begins; starts the profiler at ``first``."""
        if self.done or not self.covers(index):
            return
        try:
            if self._profiler is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                profiler = torch.profiler.profile(**self._options)
                profiler.start()
                self._profiler = profiler
            if self.link_current_span:
                span = trace.get_current_span()
                if span.is_recording():
                    name, attributes = self.event()
                    span.add_event(name, attributes)
        except Exception:
            self._fail()

    def step_ended(self, index: int) -> None:
        """Call as each step ends; at ``last`` the profiler stops and writes the trace."""
        if index >= self.last and self._profiler is not None:
            self.close()

    def close(self) -> None:
        """Stop a running profiler and write what it recorded (also for a cut-short run)."""
        profiler, self._profiler = self._profiler, None
        if profiler is None or self.done:
            return
        self.done = True
        try:
            profiler.stop()
            profiler.export_chrome_trace(self.path)
            self.written = True
        except Exception:
            self._fail()

    def event(self) -> tuple[str, dict[str, Any]]:
        """The span event linking a covered step to the trace file."""
        return PROFILE_EVENT, {
            PROFILE_PATH: self.path,
            PROFILE_FIRST: self.first,
            PROFILE_LAST: self.last,
        }

    def events_for(self, index: int) -> list[tuple[str, dict[str, Any]]]:
        """Events for a step's span built after the fact (otel-train's own spans)."""
        if not self.covers(index) or (self.done and not self.written):
            return []
        return [self.event()]

    def _fail(self) -> None:
        self.done = True
        profiler, self._profiler = self._profiler, None
        _log.exception("otel-train: the profiler window failed; profiling is off")
        if profiler is not None:
            with contextlib.suppress(Exception):
                profiler.stop()
