"""The allocator's peak goes to every phase open on any thread's stack, and a stack that
is gone (its thread ended) is let go of (recording/layouts.py: PeakStacks)."""

from __future__ import annotations

import gc

from otel_train.recording.layouts import S_PEAK_ALLOCATED, S_PEAK_RESERVED, PeakStacks, new_stack


def _phase(stack: list[list[object]]) -> list[object]:
    row: list[object] = [None] * (max(S_PEAK_ALLOCATED, S_PEAK_RESERVED) + 1)
    row[S_PEAK_ALLOCATED] = row[S_PEAK_RESERVED] = 0
    stack.append(row)
    return row


def test_every_open_phase_on_every_stack_takes_the_peak() -> None:
    peaks = PeakStacks()
    main, other = new_stack(), new_stack()
    outer, inner, theirs = _phase(main), _phase(main), _phase(other)
    peaks.fold(other, 5, 7)  # (a boundary on the other thread first)
    peaks.fold(main, 3, 9)
    assert (outer[S_PEAK_ALLOCATED], outer[S_PEAK_RESERVED]) == (3, 9)
    assert (inner[S_PEAK_ALLOCATED], inner[S_PEAK_RESERVED]) == (3, 9)
    assert (theirs[S_PEAK_ALLOCATED], theirs[S_PEAK_RESERVED]) == (5, 9)
    peaks.fold(main, 1, 1)  # (a lower peak changes nothing)
    assert (outer[S_PEAK_ALLOCATED], theirs[S_PEAK_ALLOCATED]) == (3, 5)
    assert len(peaks) == 2


def test_a_stack_that_is_gone_is_let_go_of() -> None:
    peaks = PeakStacks()
    main = new_stack()
    row = _phase(main)
    for _ in range(3):
        other = new_stack()
        _phase(other)
        peaks.fold(other, 1, 1)
        del other
        gc.collect()
    assert len(peaks) == 0
    peaks.fold(main, 4, 4)
    assert len(peaks) == 1 and row[S_PEAK_ALLOCATED] == 4
