"""Steady intervals (runs/steady.py, runs/intervals.py) from snapshots whose metrics carry
their own sample times, as a live stack returns them: a counter sampled a moment after
the step histogram of the same export still lands in the same interval."""

from __future__ import annotations

from otel_train import contract as c
from otel_train.runs.histogram import Histogram
from otel_train.runs.record_data import RankRecord, Snapshot
from otel_train.runs.steady import steady


def _step(count: float, total: float) -> Histogram:
    return Histogram(count, total, [1.0], [count, 0.0])


def test_metrics_sampled_apart_fall_in_one_interval() -> None:
    snaps = []
    for k in range(1, 9):  # an export a second: 10 steps of 0.1 s, 8 samples each
        t = float(k)
        steps = Snapshot(t, {(c.STEP_DURATION.name, ()): _step(10.0 * k, 1.0 * k)})
        # the same export's counter, sampled 2 ms after the histogram (alone, as Prometheus
        # gives it back)
        samples = Snapshot(t + 0.002, {(c.SAMPLES.name, ()): 80.0 * k})
        snaps += [steps, samples]
    rank = RankRecord("p", {c.RESOURCE_RANK.key: 0}, snaps)
    found = steady(rank, warmup=10)
    assert found.unit == "interval" and found.left_out == {"warm-up": 10}
    assert [s.steps for s in found.samples] == [10] * 7
    assert [round(s.seconds, 6) for s in found.samples] == [0.1] * 7
    # 80 samples over 1 s of steps in each interval; a misaligned read gives 0 or 160
    assert [round(s.samples_per_s or 0, 6) for s in found.samples] == [80.0] * 7
