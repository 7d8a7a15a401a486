"""StepSampler: which steps become traces."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_train.processing.blocks import StepBlock, group_steps
from otel_train.processing.resolved import finished_step
from otel_train.processing.sampling import StepSampler
from otel_train.recording.layouts import Step

MS = 1_000_000


def make(
    index: int, duration_ms: float, start_ms: float | None = None, error: bool = False
) -> Step:
    start = int((index * 1000 if start_ms is None else start_ms) * MS)
    step = finished_step(index, start, start + int(duration_ms * MS))
    step.error = error
    return step


def one(step: Step) -> StepBlock:
    """A step as a block of one (the type the sampler reads)."""
    (block,) = group_steps([step], {})
    return block


def run(sampler: StepSampler, steps: list[Step]) -> list[tuple[int, int, str]]:
    """(offered at index, emitted index, reason) for every emission."""
    out = []
    for s in steps:
        for e in sampler.offer(one(s)):
            out.append((s.index, e.index, e.sampled_because))
    return out


def test_first_step_then_the_slowest_of_each_window() -> None:
    sampler = StepSampler("sampled", window=5, window_seconds=3600, slowest=1)
    durations = [5, 1, 9, 3, 2,   4, 1, 1, 8, 2,   1, 2]  # fmt: skip
    emitted = run(sampler, [make(i, d) for i, d in enumerate(durations)])
    # Window 1 (steps 0-4): step 0 is the first, step 2 the slowest of the rest.
    # Window 2 (steps 5-9): step 8. Window 3 is still open.
    assert emitted == [(0, 0, "first"), (4, 2, "slowest"), (9, 8, "slowest")]
    closed = sampler.close_window()
    assert [(s.index, s.sampled_because) for s in closed] == [(11, "slowest")]
    assert sampler.close_window() == []


def test_the_first_step_is_traced_even_when_it_is_the_slowest() -> None:
    sampler = StepSampler("sampled", window=3, window_seconds=3600, slowest=1)
    emitted = run(sampler, [make(0, 100), make(1, 2), make(2, 1)])
    assert emitted == [(0, 0, "first"), (2, 1, "slowest")]


def test_several_slowest_per_window_come_out_in_step_order() -> None:
    sampler = StepSampler("sampled", window=6, window_seconds=3600, slowest=2)
    durations = [1, 7, 3, 9, 2, 8]
    emitted = run(sampler, [make(i, d) for i, d in enumerate(durations)])
    assert emitted == [(0, 0, "first"), (5, 3, "slowest"), (5, 5, "slowest")]


def test_errors_are_traced_at_once_and_never_counted_as_slowest() -> None:
    sampler = StepSampler("sampled", window=4, window_seconds=3600, slowest=1)
    steps = [make(0, 1), make(1, 50, error=True), make(2, 3), make(3, 2)]
    assert run(sampler, steps) == [(0, 0, "first"), (1, 1, "error"), (3, 2, "slowest")]


def test_a_window_also_closes_after_its_time() -> None:
    sampler = StepSampler("sampled", window=1000, window_seconds=0.5, slowest=1)
    # Steps of 10 ms every 100 ms: the window opened at step 0 closes at step 5's end.
    emitted = run(sampler, [make(i, 10 + i, start_ms=i * 100) for i in range(8)])
    assert emitted == [(0, 0, "first"), (5, 5, "slowest")]


def test_an_idle_window_closes_when_its_time_runs_out() -> None:
    sampler = StepSampler("sampled", window=1000, window_seconds=1.0, slowest=1)
    run(sampler, [make(0, 1, start_ms=0), make(1, 30, start_ms=10), make(2, 5, start_ms=50)])
    assert sampler.close_if_idle(500 * MS) == []
    closed = sampler.close_if_idle(1001 * MS)
    assert [(s.index, s.sampled_because) for s in closed] == [(1, "slowest")]
    assert sampler.close_if_idle(10_000 * MS) == []


def test_all_traces_every_step_and_none_traces_nothing() -> None:
    every = StepSampler("all", window=2, window_seconds=1, slowest=1)
    steps = [make(i, i + 1, error=(i == 2)) for i in range(5)]
    assert run(every, steps) == [(i, i, "all") for i in range(5)]
    nothing = StepSampler("none", window=2, window_seconds=1, slowest=1)
    assert run(nothing, [make(i, i + 1, error=True) for i in range(5)]) == []
    assert nothing.close_window() == []


def test_slowest_zero_keeps_only_first_and_errors() -> None:
    sampler = StepSampler("sampled", window=2, window_seconds=3600, slowest=0)
    steps = [make(0, 1), make(1, 9), make(2, 9, error=True), make(3, 99)]
    assert run(sampler, steps) == [(0, 0, "first"), (2, 2, "error")]


@settings(max_examples=60, deadline=None, database=None)
@given(
    durations=st.lists(st.integers(1, 1000), min_size=1, max_size=60),
    window=st.integers(1, 10),
    slowest=st.integers(1, 3),
)
def test_each_window_emits_exactly_its_slowest_steps(
    durations: list[int], window: int, slowest: int
) -> None:
    sampler = StepSampler("sampled", window=window, window_seconds=1e6, slowest=slowest)
    steps = [make(i, d) for i, d in enumerate(durations)]
    emitted = run(sampler, steps)
    tail = sampler.close_window()
    slow = [e for _, e, why in emitted if why == "slowest"] + [s.index for s in tail]
    expected = []
    for w in range(0, len(steps), window):
        candidates = [s for s in steps[w : w + window] if s.index != 0]
        ranked = sorted(candidates, key=lambda s: (s.end - s.start, s.index), reverse=True)
        expected += sorted(s.index for s in ranked[:slowest])
    assert slow == expected
    assert [e for _, e, why in emitted if why == "first"] == [0]


@pytest.mark.parametrize("mode", ["sampled", "all"])
def test_sampled_because_is_set_on_every_emitted_step(mode: str) -> None:
    sampler = StepSampler(mode, window=3, window_seconds=3600, slowest=1)
    out = []
    for i in range(9):
        out += sampler.offer(one(make(i, (i * 7) % 5 + 1)))
    out += sampler.close_window()
    assert out and all(s.sampled_because in ("first", "slowest", "error", "all") for s in out)
