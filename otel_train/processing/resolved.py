"""Finished steps resolved where they stand: plain numbers, ready for metrics, tables and
spans.

A :class:`~..recording.layouts.Step` leaves the state machine with host times and, on a
GPU, CUDA events in its rows. :func:`settle` gives it what every consumer reads: the
device times placed on the host clock in the same row positions (the caller places
them: source.py), the step's host and device seconds, and its span's extent. Every
derived figure is computed once here; the worker reads them many times. Times are
``perf_counter_ns`` values; durations are seconds.
"""

from __future__ import annotations

from typing import Any

from ..recording.layouts import P_EV0, P_EV1, P_T0, P_T1, Step
from ..recording.scopes import EXPLICIT


def settle(step: Step, device: tuple[int, int] | None = None) -> Step:
    """Derive a finished step's figures once its rows are final; ``device``: its own
    device start and end, placed on the host clock (None: host times only). Its events
    are let go of (the placed times stand for them)."""
    t0, t1 = step.t0, step.t1
    step.host_seconds = max(0, t1 - t0) / 1e9
    step.ev0 = step.ev1 = None
    step.efficiency = None
    step.sampled_because = ""
    step.start, step.end = t0, t1  # span extent: host and device times together
    if step.scalars is None:
        step.scalars = []
    if device is None:
        step.dev_start = step.dev_end = step.device_seconds = None
        return step  # every phase lies inside the step's own extent
    d0, d1 = step.dev_start, step.dev_end = device
    step.device_seconds = max(0, d1 - d0) / 1e9
    start, end = t0, max(t1, d1)
    for row in step.phases:
        p_start, p_end = row_extent(row)
        if p_start < start:
            start = p_start
        if p_end > end:
            end = p_end
    step.start, step.end = start, end
    return step


def row_extent(row: tuple[Any, ...]) -> tuple[int, int]:
    """A phase row's extent: its device times where measured (placed on the host clock),
    else its host times."""
    if row[P_EV0] is None:
        return row[P_T0], row[P_T1]
    return row[P_EV0], max(row[P_EV1], row[P_EV0])


def finished_step(index: int, t0: int, t1: int) -> Step:
    """A finished step made outside the state machine (a traced step of a block of
    recognised steps, one read off the pipe): host times, no phase yet; the caller adds
    rows and counts, and :func:`settle` has derived the rest for host times."""
    step = Step(index, t0, EXPLICIT, None, None)
    step.t1 = t1
    step.closed = True
    return settle(step)


def scalar_value(raw: Any, events: Any = None) -> float | None:
    """A recorded scalar's value: a float, or ``(pinned host tensor, event)`` filled from
    the device once the event completed (the caller checks that); the event goes back to
    ``events`` (the pool it came from)."""
    if isinstance(raw, tuple):
        if events is not None:
            events.release(raw[1])
        return float(raw[0].item())
    return raw if isinstance(raw, float) else None
