"""compare's noise judgement (runs/noise.py) on made-up step times: a change counts only
when its interval leaves out 1, it holds over every third of both runs, and the steps
themselves are apart; the cases each check alone would let through."""

from __future__ import annotations

import random

from otel_train.runs.compare import change
from otel_train.runs.noise import ratio_of_medians, separation, thirds


def _steps(values: list[float], seed: int) -> list[float]:
    rng = random.Random(seed)
    return [v * rng.uniform(0.98, 1.02) for v in values]


def test_two_kinds_of_step_whose_medians_fall_apart_are_within_noise() -> None:
    # quick steps (1 ms) and steps that waited for the CPU (15 ms), mixed through both
    # runs: A 40% slow, B 60% slow. The median jumps from one kind to the other.
    a = _steps([15.0 if i % 10 < 4 else 1.0 for i in range(200)], 1)
    b = _steps([15.0 if i % 10 < 6 else 1.0 for i in range(200)], 2)
    r = ratio_of_medians(a, b)
    assert r is not None and r.ratio > 5 and r.low > 5  # the interval alone: "slower"
    assert r.thirds_apart()  # (and so are the thirds)
    assert 0.29 < r.separation < 0.71
    assert change("time", r, 0.10) == ("within noise", "within noise")


def test_a_change_smaller_than_a_run_moved_over_its_course_is_within_noise() -> None:
    # A's last third is slower than its first two; B sits between: its steps are mostly
    # above A's and its median 20% above, but not above A's last third.
    a = _steps([1.0] * 20 + [1.0] * 4 + [1.3] * 6, 3)
    b = _steps([1.2] * 30, 4)
    r = ratio_of_medians(a, b)
    assert r is not None and r.low > 1.1 and r.separation > 0.71
    assert thirds(a) is not None and max(thirds(a) or []) > max(thirds(b) or [])
    assert not r.thirds_apart()
    assert change("time", r, 0.10)[0] == "within noise"


def test_a_change_through_both_runs_is_named_with_its_interval() -> None:
    a = _steps([1.0] * 60, 5)
    b = _steps([1.5] * 60, 6)
    r = ratio_of_medians(a, b)
    assert r is not None and r.thirds_apart() and separation(a, b) == 1.0
    verdict, words = change("time", r, 0.10)
    assert verdict == "slower" and words.startswith("50% slower (95% interval 4")
    assert change("rate", r, 0.10)[0] == "higher"
    back = ratio_of_medians(b, a)
    assert back is not None and change("time", back, 0.10)[0] == "faster"


def test_runs_too_short_for_thirds_are_judged_by_the_rest() -> None:
    r = ratio_of_medians([1.0, 1.01, 0.99, 1.0], [2.0, 2.01, 1.99, 2.0])
    assert r is not None and r.a_thirds is None and r.thirds_apart()
    assert change("time", r, 0.10)[0] == "slower"
