"""Steady intervals (runs/steady.py, runs/intervals.py) from snapshots whose metrics carry
their own sample times, as a live stack returns them: a counter sampled a moment after
the step histogram of the same export still lands in the same interval."""

from __future__ import annotations

from otel_train import contract as c
from otel_train.runs import figures as f
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


def _uneven(counter_offset: float, phase_offset: float) -> RankRecord:
    """Exports a second apart holding 10 then 20 steps (1 s of steps each); the samples
    counter and the phase histogram sampled ``*_offset`` seconds from the step histogram."""
    snaps, steps, seconds = [], 0.0, 0.0
    for k in range(1, 9):
        steps, seconds = steps + (10.0 if k % 2 else 20.0), seconds + 1.0
        t = float(k)
        snaps.append(Snapshot(t, {(c.STEP_DURATION.name, ()): _step(steps, seconds)}))
        snaps.append(Snapshot(t + counter_offset, {(c.SAMPLES.name, ()): 8.0 * steps}))
        forward = (c.PHASE_DURATION.name, ((c.A_PHASE, "forward"),))
        snaps.append(Snapshot(t + phase_offset, {forward: _step(steps, seconds / 2)}))
    snaps.sort(key=lambda s: s.t)
    return RankRecord("p", {c.RESOURCE_RANK.key: 0}, snaps)


def test_a_counter_sampled_after_the_histogram_lands_in_its_interval() -> None:
    found = steady(_uneven(0.002, -0.002), warmup=0)
    # 8 samples a step: 80 then 160 samples over each 1 s of steps (read one export late,
    # 160 then 80)
    assert [round(s.samples_per_s or 0, 6) for s in found.samples] == [80.0, 160.0] * 4
    assert [round(s.phases["forward"], 6) for s in found.samples] == [0.05, 0.025] * 4


def test_the_report_bins_a_phase_with_the_step_of_its_export() -> None:
    # the phase histogram 2 ms after the step's, a bin's edge between them (the grid
    # starts a bin before the first snapshot: the counter's, 0.999 s early)
    rank = _uneven(-0.999, 0.002)
    start, n = f.time_bins([rank], 1.0)
    assert f.bin_index(1.0, start, 1.0, n) != f.bin_index(1.002, start, 1.0, n)
    steps = f.histograms([rank], c.STEP_DURATION.name, start, 1.0, n)[""]
    forward = f.histograms([rank], c.PHASE_DURATION.name, start, 1.0, n, by=c.A_PHASE)["forward"]
    per_step = [p.total / s.count for p, s in zip(forward, steps, strict=True) if s and p]
    assert [round(x, 6) for x in per_step] == [0.05, 0.025] * 4  # half of each step
