"""The straggler rules of deploy/prometheus/rules/stragglers.yml under ``promtool test rules``.

Synthetic native histograms (exponential buckets as OTLP sends them, and custom buckets as
Prometheus makes of explicit ones) of 1, 2, 3 and 4 ranks in synchronous data parallel
training: every rank's step takes the same time (they meet in the all-reduce); the
straggler is slow in one phase and the healthy ranks wait for it in ``backward``. promtool
evaluates the real rule file over 20 minutes of these series and compares the scores and
alerts with what the rules' definition gives by hand: the straggler alone scores under 1
and alone fires, at every world size (with 2 ranks the waiting rank's ``backward`` is as
far from the mean as the straggler's slow phase, which is why that world size has rules of
its own); one rank alone is never a straggler. Where the ranks also time their collectives
(otel_train.collective.duration), the healthy ranks' waits show there, in backward or in
another phase, and the rank that waits least is the one named.
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path

import pytest
import rule_tests

from otel_train import contract as c

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "stragglers.yml"
PER_MIN = 60  # observations per minute and series
SCALE = c.DURATION_MAX_SCALE  # the exponential histograms' scale (Prometheus schema)
# Custom buckets: the explicit bounds Prometheus keeps when it converts a classic OTLP
# histogram (convert_histograms_to_nhcb) or a scraped one.
BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
FORMS = ("exponential", "custom")
COLLECTIVE = c.prometheus_base_name(c.COLLECTIVE_DURATION)


def native_series(metric: str, labels: dict[str, str], value: float, form: str) -> dict[str, str]:
    """A native histogram series (promtool's notation) whose observations are all ``value``:
    PER_MIN a minute for 20 minutes, in one bucket."""
    if form == "exponential":
        # Prometheus's bucket i is (base**(i-1), base**i], base = 2 ** 2 ** -SCALE.
        layout = f"schema:{SCALE} offset:{math.ceil(math.log2(value) * 2**SCALE)}"
    else:
        values = " ".join(f"{b:g}" for b in BOUNDS)
        layout = f"schema:-53 custom_values:[{values}] offset:{bisect.bisect_left(BOUNDS, value)}"
    sel = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    step = f"{{{{{layout} count:{PER_MIN} sum:{PER_MIN * value:g} buckets:[{PER_MIN}]}}}}"
    return {"series": f"{metric}{{{sel}}}", "values": f"{{{{{layout} count:0 sum:0}}}}+{step}x20"}


def median(value: float, form: str) -> float:
    """histogram_quantile(0.5) of a histogram whose observations all lie in ``value``'s
    bucket: the geometric middle of an exponential bucket (Prometheus interpolates
    exponentially there), the arithmetic middle of a custom one."""
    if form == "exponential":
        i = math.ceil(math.log2(value) * 2**SCALE)
        return float(2 ** ((i - 0.5) / 2**SCALE))
    k = bisect.bisect_left(BOUNDS, value)
    lo = BOUNDS[k - 1] if k else 0.0
    return lo + (BOUNDS[k] - lo) / 2


HEALTHY = {"data": 0.002, "forward": 0.02, "backward": 0.02, "optimizer": 0.004}
SLOW = 0.08  # the straggler's slow phase, and the healthy ranks' all-reduce wait
STEP = 0.2
WAIT = SLOW - HEALTHY["backward"]  # what a healthy rank waits for the straggler, per step
ARRIVES_LAST = 0.0005  # what the straggler waits in the same collective: next to nothing


def scenario(
    ranks: int,
    slow_rank: int,
    slow_phase: str,
    form: str,
    wait_phase: str = "backward",
    collectives: str = "",
) -> list[dict[str, str]]:
    """Series of ``ranks`` ranks; ``slow_rank`` slow in ``slow_phase``, the others waiting
    for it in ``wait_phase``. ``collectives``: the op that waits, timed by every rank in
    otel_train.collective.duration (one a step), or "" where none are timed."""
    step = c.prometheus_base_name(c.STEP_DURATION)
    phase = c.prometheus_base_name(c.PHASE_DURATION)
    series = []
    for rank in range(ranks):
        base = {"job": "train", "otel_train_rank": str(rank)}
        series.append(native_series(step, base, STEP, form))
        slow = rank == slow_rank
        waits = slow_rank >= 0 and not slow  # healthy ranks wait for the straggler
        for name, healthy in HEALTHY.items():
            value = healthy
            if slow and name == slow_phase:
                value = SLOW
            elif waits and name == wait_phase:  # the phase that holds the collective wait
                value = round(healthy + WAIT, 9)
            labels = {**base, "phase": name, "clock": "host"}
            series.append(native_series(phase, labels, value, form))
        if collectives:
            op = {
                c.prometheus_label(c.A_COLLECTIVE_OP): collectives,
                c.prometheus_label(c.A_COLLECTIVE_GROUP): "default_pg",
            }
            waited = WAIT if waits else ARRIVES_LAST
            series.append(native_series(COLLECTIVE, {**base, **op}, waited, form))
    return series


def run_promtool(stack_bins: Path, tmp_path: Path, tests: list[dict]) -> None:
    rule_tests.run_promtool(stack_bins, RULES, tests, "1m", tmp_path)


def straggler_alert(rank: int, score: float) -> dict[str, object]:
    """OtelTrainStraggler as it fires for ``rank`` with ``score``."""
    return {
        "exp_labels": {"severity": "warning", "job": "train", "otel_train_rank": str(rank)},
        "exp_annotations": rule_tests.annotations(RULES, "OtelTrainStraggler", rank, score),
    }


WORLDS = [(2, 1), (3, 2), (4, 2)]  # (ranks, the slow rank)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("slow_phase", ["forward", "data"])
@pytest.mark.parametrize(("ranks", "slow"), WORLDS, ids=[f"{n}-ranks" for n, _ in WORLDS])
def test_the_slow_rank_scores_lowest_and_alone_fires(
    stack_bins: Path, tmp_path: Path, ranks: int, slow: int, slow_phase: str, form: str
) -> None:
    # The reference is a healthy rank's time: the median rank, or with 2 ranks the faster.
    score = round(median(HEALTHY[slow_phase], form) / median(SLOW, form), 6)
    assert score < 0.7
    scores = [
        {"labels": f'{{job="train", otel_train_rank="{r}"}}', "value": score if r == slow else 1}
        for r in range(ranks)
    ]
    test = {
        "interval": "1m",
        "input_series": scenario(ranks, slow, slow_phase, form),
        "promql_expr_test": [
            {
                "expr": "round(job_rank:otel_train_straggler_score:min, 0.000001)",
                "eval_time": "15m",
                "exp_samples": scores,
            },
            {
                "expr": "job:otel_train_ranks:count5m",
                "eval_time": "15m",
                "exp_samples": [
                    {"labels": 'job:otel_train_ranks:count5m{job="train"}', "value": ranks}
                ],
            },
        ],
        "alert_rule_test": [
            {"alertname": "OtelTrainStraggler", "eval_time": "8m", "exp_alerts": []},
            {
                "alertname": "OtelTrainStraggler",
                "eval_time": "15m",
                "exp_alerts": [straggler_alert(slow, score)],
            },
        ],
    }
    run_promtool(stack_bins, tmp_path, [test])


@pytest.mark.parametrize("form", FORMS)
def test_two_ranks_do_not_score_the_all_reduce_wait(
    stack_bins: Path, tmp_path: Path, form: str
) -> None:
    # Rank 0 waits 4x longer in backward than rank 1, which is slow in forward: against the
    # mean of two both would score 0.5x. backward is a collective wait: not scored.
    section = "job_rank_phase:otel_train_straggler_score:ratio"
    test = {
        "interval": "1m",
        "input_series": scenario(2, 1, "forward", form),
        "promql_expr_test": [
            {
                "expr": f'count by (otel_train_rank, phase) ({section}{{phase="backward"}})',
                "eval_time": "15m",
                "exp_samples": [],
            },
            {
                "expr": f"round({section}, 0.000001)",
                "eval_time": "15m",
                "exp_samples": [
                    {
                        "labels": '{job="train", otel_train_rank="1", phase="forward"}',
                        "value": round(median(HEALTHY["forward"], form) / median(SLOW, form), 6),
                    }
                ],
            },
        ],
    }
    run_promtool(stack_bins, tmp_path, [test])


# Where healthy ranks wait for the straggler, and the op they time doing it: DDP's gradient
# all-reduce at the end of backward, or an explicit all_reduce in the optimizer step (a
# phase the 2-rank rules would otherwise score).
WAITS = {"backward": "ddp_all_reduce", "optimizer": "all_reduce"}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("wait_phase", sorted(WAITS))
@pytest.mark.parametrize("ranks", [2, 4], ids=["2-ranks", "4-ranks"])
def test_the_rank_that_waits_least_is_the_slow_one(
    stack_bins: Path, tmp_path: Path, ranks: int, wait_phase: str, form: str
) -> None:
    """The healthy ranks' waits show up in otel_train.collective.duration; the slow rank's
    forward is slow and it waits next to nothing: only it is named, with its forward as
    its worst section and its work (step less waits) scored too."""
    slow = ranks // 2
    score = round(median(HEALTHY["forward"], form) / median(SLOW, form), 6)
    work = round((STEP - WAIT) / (STEP - ARRIVES_LAST), 6)  # the reference: a waiting rank
    section = "job_rank_phase:otel_train_straggler_score:ratio"
    test = {
        "interval": "1m",
        "input_series": scenario(ranks, slow, "forward", form, wait_phase, WAITS[wait_phase]),
        "promql_expr_test": [
            {
                "expr": "round(job_rank:otel_train_straggler_score:min, 0.000001)",
                "eval_time": "15m",
                "exp_samples": [
                    {
                        "labels": f'{{job="train", otel_train_rank="{r}"}}',
                        "value": score if r == slow else 1,
                    }
                    for r in range(ranks)
                ],
            },
            {
                "expr": f"round({section}, 0.000001)",
                "eval_time": "15m",
                "exp_samples": [
                    {
                        "labels": f'{{job="train", otel_train_rank="{slow}", phase="forward"}}',
                        "value": score,
                    }
                ],
            },
            {
                "expr": "round(job_rank:otel_train_work_straggler_score:ratio, 0.000001)",
                "eval_time": "15m",
                "exp_samples": [
                    {"labels": f'{{job="train", otel_train_rank="{slow}"}}', "value": work}
                ],
            },
        ],
        "alert_rule_test": [
            {
                "alertname": "OtelTrainStraggler",
                "eval_time": "15m",
                "exp_alerts": [straggler_alert(slow, score)],
            },
        ],
    }
    run_promtool(stack_bins, tmp_path, [test])


@pytest.mark.parametrize("collectives", ["", "ddp_all_reduce"], ids=["untimed", "timed"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_no_straggler_no_alert(
    stack_bins: Path, tmp_path: Path, ranks: int, collectives: str
) -> None:
    test = {
        "interval": "1m",
        "input_series": scenario(
            ranks, slow_rank=-1, slow_phase="forward", form="exponential", collectives=collectives
        ),
        "promql_expr_test": [
            {
                "expr": "round(job_rank:otel_train_straggler_score:min, 0.000001)",
                "eval_time": "15m",
                "exp_samples": [
                    {"labels": f'{{job="train", otel_train_rank="{r}"}}', "value": 1}
                    for r in range(ranks)
                ],
            }
        ],
        "alert_rule_test": [
            {"alertname": "OtelTrainStraggler", "eval_time": "19m", "exp_alerts": []}
        ],
    }
    run_promtool(stack_bins, tmp_path, [test])


def test_one_rank_alone_is_never_a_straggler(stack_bins: Path, tmp_path: Path) -> None:
    # A slow forward, but no other rank to be slower than: the rank is its own reference.
    test = {
        "interval": "1m",
        "input_series": scenario(1, slow_rank=0, slow_phase="forward", form="exponential"),
        "promql_expr_test": [
            {
                "expr": "round(job_rank:otel_train_straggler_score:min, 0.000001)",
                "eval_time": "15m",
                "exp_samples": [{"labels": '{job="train", otel_train_rank="0"}', "value": 1}],
            },
            {
                "expr": "job_rank_phase:otel_train_straggler_score:ratio",
                "eval_time": "15m",
                "exp_samples": [],
            },
        ],
        "alert_rule_test": [
            {"alertname": "OtelTrainStraggler", "eval_time": "19m", "exp_alerts": []}
        ],
    }
    run_promtool(stack_bins, tmp_path, [test])
