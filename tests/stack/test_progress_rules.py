"""The hang rules of deploy/prometheus/rules/progress.yml under ``promtool test rules``.

Synthetic gauges as ranks export them every 10 s (otel-train's default export interval):
each rank's progress age (rising while its training thread is stuck), its limit
(hang_after, or an open region's budget) and whether it waits inside a collective.
promtool evaluates the real rule file at its group's interval (2 s) and checks when
OtelTrainRankStalled fires, for which ranks, and which rank the job waits for.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import rule_tests
import yaml

from otel_train import contract as c

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "progress.yml"
EXPORT = 10  # seconds between a rank's exports
SAMPLES = 13  # t = 0, 10, ..., 120 s
HANG_AFTER = 8.0
AGE = c.prometheus_base_name(c.PROGRESS_AGE)
LIMIT = c.prometheus_base_name(c.PROGRESS_LIMIT)
WAITING = c.prometheus_base_name(c.COLLECTIVE_WAITING)
HOLDING = "job_rank:otel_train_progress_age_seconds:holding"


def ages(stall_at: float | None, until: float = 1e9) -> list[float | None]:
    """The age each export reports: a fraction of a step while the rank progresses, the
    time since ``stall_at`` once it is stuck; None (no sample) after ``until``."""
    out: list[float | None] = []
    for k in range(SAMPLES):
        t = k * EXPORT
        if t > until:
            out.append(None)
        else:
            out.append(0.25 if stall_at is None or t < stall_at else t - stall_at)
    return out


def series(metric: str, rank: int, values: list[float | None], **labels: str) -> dict[str, str]:
    sel = ", ".join(
        f'{k}="{v}"' for k, v in {"job": "train", "otel_train_rank": str(rank), **labels}.items()
    )
    text = " ".join("_" if v is None else f"{v:g}" for v in values)
    return {"series": f"{metric}{{{sel}}}", "values": text}


def rank_series(
    rank: int,
    stall_at: float | None = None,
    waiting_from: float | None = None,
    limits: list[float] | None = None,
    until: float = 1e9,
    **labels: str,
) -> list[dict[str, str]]:
    """A rank's three gauges; ``waiting_from``: when it entered the collective it is stuck
    in; ``limits``: its limit at each export (absent: hang_after off)."""
    age = ages(stall_at, until)
    waiting = [
        None if a is None else float(waiting_from is not None and k * EXPORT >= waiting_from)
        for k, a in enumerate(age)
    ]
    out = [series(AGE, rank, age, **labels), series(WAITING, rank, waiting, **labels)]
    if limits is not None:
        out.append(
            series(
                LIMIT,
                rank,
                [v if a is not None else None for v, a in zip(limits, age, strict=True)],
                **labels,
            )
        )
    return out


def stalled(rank: int, age: float, alert: str = "OtelTrainRankStalled") -> dict[str, object]:
    """``alert`` (OtelTrainRankStalled, or OtelTrainRankHoldsJob) as it fires for ``rank``."""
    return {
        "exp_labels": {"severity": "critical", "job": "train", "otel_train_rank": str(rank)},
        "exp_annotations": rule_tests.annotations(RULES, alert, rank, age),
    }


def holding(at: str, rank: int, age: float) -> dict[str, object]:
    """The expectation that at ``at`` the job waits for ``rank`` alone, last seen at ``age``."""
    labels = f'{HOLDING}{{job="train", otel_train_rank="{rank}"}}'
    return {"expr": HOLDING, "eval_time": at, "exp_samples": [{"labels": labels, "value": age}]}


def run_promtool(stack_bins: Path, tmp_path: Path, input_series: list, tests: dict) -> None:
    test = {"interval": f"{EXPORT}s", "input_series": input_series, **tests}
    (group,) = yaml.safe_load(RULES.read_text())["groups"]  # promtool ignores its interval
    rule_tests.run_promtool(stack_bins, RULES, [test], group["interval"], tmp_path)


LIMITS = [HANG_AFTER] * SAMPLES


def test_stalled_ranks_fire_and_the_one_outside_the_collective_holds_the_job(
    stack_bins: Path, tmp_path: Path
) -> None:
    # Rank 2 stops at t = 35 s outside any collective; its 3 peers reach the next
    # all-reduce at t = 36 s and wait there. The first export past 8 s is at t = 50 s.
    peers = [0, 1, 3]
    input_series = rank_series(2, stall_at=35, limits=LIMITS)
    for r in peers:
        input_series += rank_series(r, stall_at=36, waiting_from=40, limits=LIMITS)
    at50 = {2: 15.0, **{r: 14.0 for r in peers}}
    tests = {
        "alert_rule_test": [
            # t = 40 s: ages 5 and 4 s, under the limit; the evaluation at 48 s still sees them.
            {"alertname": "OtelTrainRankStalled", "eval_time": "48s", "exp_alerts": []},
            {
                "alertname": "OtelTrainRankStalled",
                "eval_time": "50s",
                "exp_alerts": [stalled(r, at50[r]) for r in sorted(at50)],
            },
            {"alertname": "OtelTrainRankHoldsJob", "eval_time": "48s", "exp_alerts": []},
            {
                "alertname": "OtelTrainRankHoldsJob",
                "eval_time": "50s",
                "exp_alerts": [stalled(2, 15.0, "OtelTrainRankHoldsJob")],
            },
        ],
        "promql_expr_test": [
            holding("70s", 2, 35),
        ],
    }
    run_promtool(stack_bins, tmp_path, input_series, tests)


def test_a_rank_stalled_alone_holds_nobody(stack_bins: Path, tmp_path: Path) -> None:
    # Rank 1 is stuck outside collectives; rank 0 keeps progressing (no collective between
    # them yet): rank 1 is stalled, but no rank waits for it.
    input_series = rank_series(0, limits=LIMITS) + rank_series(1, stall_at=35, limits=LIMITS)
    tests = {
        "alert_rule_test": [
            {
                "alertname": "OtelTrainRankStalled",
                "eval_time": "50s",
                "exp_alerts": [stalled(1, 15.0)],
            },
            {"alertname": "OtelTrainRankHoldsJob", "eval_time": "100s", "exp_alerts": []},
        ],
    }
    run_promtool(stack_bins, tmp_path, input_series, tests)


def test_a_rank_whose_figures_stop_holds_its_waiting_peers(
    stack_bins: Path, tmp_path: Path
) -> None:
    # Rank 1 is killed at t = 32 s (its last export at 30 s: age 0.25 s, not waiting);
    # rank 0 waits for it in an all-reduce from t = 33 s. Silent for more than 30 s at 62 s.
    input_series = rank_series(1, limits=LIMITS, until=30)
    input_series += rank_series(0, stall_at=33, waiting_from=40, limits=LIMITS)
    tests = {
        "alert_rule_test": [
            {
                "alertname": "OtelTrainRankStalled",
                "eval_time": "50s",
                "exp_alerts": [stalled(0, 17.0)],
            },
            {"alertname": "OtelTrainRankHoldsJob", "eval_time": "60s", "exp_alerts": []},
        ],
        "promql_expr_test": [
            holding("62s", 1, 0.25),
        ],
    }
    run_promtool(stack_bins, tmp_path, input_series, tests)


def test_a_job_that_ends_while_stalled_stops_alerting(stack_bins: Path, tmp_path: Path) -> None:
    # Both ranks exit at t = 62 s and their last exports (at 60 s) say they are stalled:
    # the rules stop counting them once those samples are 30 s old, and never name rank 0
    # (the one waiting) as holding the job.
    input_series = rank_series(1, stall_at=35, limits=LIMITS, until=60)
    input_series += rank_series(0, stall_at=36, waiting_from=40, limits=LIMITS, until=60)
    alerts = [
        {
            "alertname": "OtelTrainRankStalled",
            "eval_time": "88s",
            "exp_alerts": [stalled(0, 24.0), stalled(1, 25.0)],
        },
        {"alertname": "OtelTrainRankStalled", "eval_time": "90s", "exp_alerts": []},
        {"alertname": "OtelTrainRankHoldsJob", "eval_time": "90s", "exp_alerts": []},
    ]
    tests = {
        "alert_rule_test": alerts,
        "promql_expr_test": [
            holding("88s", 1, 25),
            {
                "expr": f'count_over_time({HOLDING}{{otel_train_rank="0"}}[120s])',
                "eval_time": "120s",
                "exp_samples": [],
            },
        ],
    }
    run_promtool(stack_bins, tmp_path, input_series, tests)


@pytest.mark.parametrize(
    ("case", "limits", "labels"),
    [
        # A checkpoint region opens at t = 30 s with a 60 s budget: its limit, not hang_after.
        ("checkpoint-budget", [HANG_AFTER] * 3 + [60.0] * (SAMPLES - 3), {}),
        # hang_after off: no limit series, never stalled.
        ("hang-after-off", None, {}),
        # The in-process /metrics copy of a stalled rank: the rules read OTLP series only.
        ("scrape-copy", LIMITS, {"otel_train_source": "scrape"}),
    ],
)
def test_no_alert_within_the_limit_or_without_one(
    stack_bins: Path, tmp_path: Path, case: str, limits: list[float] | None, labels: dict[str, str]
) -> None:
    input_series = rank_series(0, stall_at=35, limits=limits, **labels)
    last = f"{(SAMPLES - 1) * EXPORT}s"  # age 85 s: past a 60 s budget only at the end
    at_last = [stalled(0, 85.0)] if case == "checkpoint-budget" else []
    alerts = [
        {"alertname": "OtelTrainRankStalled", "eval_time": "90s", "exp_alerts": []},
        {"alertname": "OtelTrainRankStalled", "eval_time": last, "exp_alerts": at_last},
    ]
    run_promtool(stack_bins, tmp_path, input_series, {"alert_rule_test": alerts})


def test_slow_steps_that_progress_never_stall(stack_bins: Path, tmp_path: Path) -> None:
    # Phases of up to 6 s: the age rises, a boundary resets it; never past 8 s.
    age = [float((k * EXPORT) % 6) for k in range(SAMPLES)]
    input_series = [
        series(AGE, 0, age),
        series(LIMIT, 0, LIMITS),
        series(WAITING, 0, [0.0] * SAMPLES),
    ]
    alerts = [
        {"alertname": name, "eval_time": f"{t}s", "exp_alerts": []}
        for name in ("OtelTrainRankStalled", "OtelTrainRankHoldsJob")
        for t in (30, 60, 120)
    ]
    run_promtool(stack_bins, tmp_path, input_series, {"alert_rule_test": alerts})
