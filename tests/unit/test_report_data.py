"""The report's reading of histograms: quantiles as Prometheus's histogram_quantile
computes them, from explicit and from exponential OTLP buckets; differences and sums of
snapshots whose buckets changed; the page data of a run of one snapshot."""

from __future__ import annotations

import pytest

from otel_train import contract as c
from otel_train.runs.page_data import page_data
from otel_train.runs.record_data import Histogram, RankRecord, Run, Snapshot, _exponential
from otel_train.runs.summary import summary_text


def test_explicit_bucket_quantiles_interpolate_within_the_bucket() -> None:
    h = Histogram(count=10, total=0.0, bounds=[1.0, 2.0, 4.0], counts=[2, 6, 2, 0])
    assert h.quantile(0.5) == pytest.approx(1.0 + (5 - 2) / 6)  # in (1, 2]
    assert h.quantile(0.95) == pytest.approx(2.0 + 2.0 * (9.5 - 8) / 2)  # in (2, 4]
    assert Histogram(0, 0.0, [1.0], [0, 0]).quantile(0.5) is None


def test_deltas_subtract_bucket_by_bucket() -> None:
    old = Histogram(count=4, total=2.0, bounds=[1.0], counts=[3, 1])
    new = Histogram(count=10, total=7.0, bounds=[1.0], counts=[5, 5])
    d = new.minus(old)
    assert (d.count, d.total, d.counts) == (6, 5.0, [2, 4])


def test_exponential_buckets_read_as_their_bounds() -> None:
    # scale 0: base 2; offset 1: buckets (2, 4], (4, 8]
    h = _exponential({"scale": 0, "count": 4, "sum": 20.0, "zeroCount": 0,
                      "positive": {"offset": 1, "bucketCounts": ["2", "2"]}})  # fmt: skip
    assert h.bounds[:3] == [2.0, 4.0, 8.0]
    assert h.quantile(0.5) == pytest.approx(4.0)  # the end of (2, 4]
    assert h.quantile(0.75) == pytest.approx(6.0)  # halfway through (4, 8]


def test_deltas_of_an_exponential_histogram_whose_buckets_changed() -> None:
    """An exponential histogram grows buckets and lowers its scale as values spread: the
    later snapshot's buckets differ from the earlier's, and the difference re-bins the
    earlier onto them (a finer bucket lies in one coarser bucket)."""
    old = _exponential(
        {
            "scale": 1,
            "count": 2,
            "sum": 2.5,
            "zeroCount": 0,
            "positive": {"offset": 0, "bucketCounts": ["2"]},
        }
    )  # (1, 1.41]: 2
    new = _exponential({"scale": 0, "count": 7, "sum": 20.0, "zeroCount": 0,
                        "positive": {"offset": 0, "bucketCounts": ["3", "4"]}})  # fmt: skip
    d = new.minus(old)  # (1, 2]: 3 - 2, (2, 4]: 4
    assert (d.count, d.total) == (5, 17.5)
    assert d.bounds == new.bounds
    assert d.counts == [0, 1, 4, 0]  # (zero bucket, (1, 2], (2, 4], +Inf)
    both = old.plus(new)
    assert (both.count, sum(both.counts)) == (9, 9)
    assert both.quantile(1.0) == pytest.approx(4.0)


def _snapshot(t: float, steps: float, phase_s: float, rss: float) -> Snapshot:
    h = Histogram(steps, phase_s, [0.1, 1.0], [0.0, steps, 0.0])
    return Snapshot(t, {
        (c.STEPS.name, ()): steps, (c.SAMPLES.name, ()): 16 * steps,
        (c.TOKENS.name, ()): 128 * steps, (c.PROCESS_MEMORY_RSS.name, ()): rss,
        (c.RUN_TIME.name, ((c.A_CATEGORY, "train"),)): 9.0,
        (c.RUN_TIME.name, ((c.A_CATEGORY, "data"),)): 1.0,
        (c.STEP_DURATION.name, ()): Histogram(steps, phase_s, [0.1, 1.0], [0.0, steps, 0.0]),
        (c.PHASE_DURATION.name, ((c.A_PHASE, "forward"),)): h,
    })  # fmt: skip


def test_a_run_of_one_snapshot_has_the_figures_of_its_panels() -> None:
    """No curve to draw from one snapshot: each panel carries the run's figures."""
    rank = RankRecord("rank0", {"service.name": "x"}, [_snapshot(100.0, 20, 4.0, 5e8)])
    data = page_data(Run([rank]), "x")
    figures = {ch["id"]: {f["label"]: f["value"] for f in ch["figures"]} for ch in data["charts"]}
    assert figures["throughput"] == {"samples/s": 32.0, "tokens/s": 256.0}  # over 10 s
    assert figures["stall"] == {"data stall": 0.1}
    assert figures["goodput"] == {"goodput": 0.9}
    assert figures["memory"] == {"process RSS": 5e8}
    assert figures["phases"] == {"forward": pytest.approx(0.2)}  # 4 s over 20 steps
    assert figures["step"]["mean"] == pytest.approx(0.2)


def test_time_per_step_by_phase_is_per_step_from_the_first_bin() -> None:
    snaps = [_snapshot(100.0 + i, 10 * (i + 1), 2.0 * (i + 1), 5e8) for i in range(4)]
    data = page_data(Run([RankRecord("rank0", {}, snaps)]), "x")
    (phases,) = [ch for ch in data["charts"] if ch["id"] == "phases"]
    (forward,) = phases["series"]
    assert [v for v in forward["values"] if v is not None] == [pytest.approx(0.2)] * 4


def test_the_summary_shows_time_waiting_in_collectives() -> None:
    """Issue 23: the report's summary splits waiting from work as the console does."""
    snap = _snapshot(100.0, 20, 4.0, 5e8)
    wait = Histogram(20, 1.0, [0.1, 1.0], [0.0, 20, 0.0])
    key = ((c.A_COLLECTIVE_GROUP, "default_pg"), (c.A_COLLECTIVE_OP, "all_reduce"))
    snap.values[(c.COLLECTIVE_DURATION.name, key)] = wait
    text = summary_text(RankRecord("rank0", {"service.name": "x"}, [snap]))
    assert "waiting in all_reduce" in text
    assert "waiting in collectives 25.0% of step time" in text  # 1 s of 4 s in steps
