"""2 and 4 ranks under torchrun against the real stack: identity per rank, a straggler found.

``torchrun --nproc_per_node=N`` runs DDP training (gloo, CPU) instrumented with one call to
``otel_train.instrument``; one rank sleeps in its forward pass (SLOW_RANK in the training
script's environment: rank 1 of 2, rank 2 of 4). The ranks export over OTLP/HTTP to the
Collector started from deploy/ on free loopback ports; both jobs go to one stack. Then
Jaeger holds step traces of every rank with their resource attributes, Prometheus holds
per-rank series, the straggler rules of deploy/prometheus/rules/stragglers.yml (loaded
here with a 1 s group interval and a 3 s ``for:``, nothing else changed) give the slow rank
the lowest score and name it alone in OtelTrainStraggler (with 2 ranks the healthy rank
waits as long in its backward as the slow one spends in its forward: the rules must not
name it), and every query of the training overview returns data for the job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ddp_job import STEPS, fast_rules, run_ddp
from series_budget import CUDA_ONLY_SERIES, SERIES_PER_DDP_RANK
from stack_helpers import (
    attrs,
    dashboard_queries,
    jaeger_chunks,
    jaeger_traces,
    poll,
    prom,
    query_data,
    running_stack,
)

from otel_train import contract as c

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.stack
WORLDS = {2: 1, 4: 2}  # ranks -> the slow rank


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    config = fast_rules(tmp_path_factory.mktemp("torchrun-config"))
    run = tmp_path_factory.mktemp("torchrun-stack")
    with running_stack(run, OTEL_TRAIN_STACK_PROMETHEUS_CONFIG=str(config)) as running:
        yield running


@pytest.fixture(scope="module", params=sorted(WORLDS), ids=lambda n: f"{n}-ranks")
def run(stack: Any, tmp_path_factory: pytest.TempPathFactory, request: Any) -> dict[str, Any]:
    ranks = request.param
    return run_ddp(stack, tmp_path_factory.mktemp("torchrun"), ranks, WORLDS[ranks])


def test_jaeger_holds_traces_of_every_rank_with_their_identity(
    stack: Any, run: dict[str, Any]
) -> None:
    def first_steps() -> dict[int, dict[str, Any]]:
        # The resource attributes ride on the resourceSpans; the rank also on each step span.
        spans = jaeger_traces(stack, run["service"], run["start"])
        roots = [s for s in spans if s["name"] == c.STEP_SPAN.name]
        by_rank = {int(attrs(s)[c.RANK.key]): s for s in roots}
        return by_rank if len(by_rank) == run["ranks"] else {}

    by_rank = poll(first_steps, f"step traces of {run['ranks']} ranks in Jaeger")
    assert sorted(by_rank) == list(range(run["ranks"]))
    resources = jaeger_resources(stack, run)
    assert sorted(int(r[c.RESOURCE_RANK.key]) for r in resources) == list(range(run["ranks"]))
    for r in resources:
        assert int(r[c.RESOURCE_WORLD_SIZE.key]) == run["ranks"]
        assert int(r[c.RESOURCE_LOCAL_RANK.key]) == int(r[c.RESOURCE_RANK.key])
        assert int(r[c.RESOURCE_NODE_RANK.key]) == 0
    assert len({r["service.instance.id"] for r in resources}) == run["ranks"]
    assert len({r[c.RESOURCE_JOB.key] for r in resources}) == 1  # torchrun's run id


def jaeger_resources(stack: Any, run: dict[str, Any]) -> list[dict[str, Any]]:
    """One attribute dict per distinct resource in the service's traces."""
    seen: dict[str, dict[str, Any]] = {}
    for rs in jaeger_chunks(stack, run["service"], run["start"]):
        a = attrs(rs.get("resource", {}))
        seen[a["service.instance.id"]] = a
    return list(seen.values())


def test_prometheus_holds_per_rank_series(stack: Any, run: dict[str, Any]) -> None:
    phase = c.prometheus_base_name(c.PHASE_DURATION)  # a native histogram
    sel = f'{{job="{run["service"]}", phase="forward"}}'

    def per_rank() -> dict[str, float]:
        query = f"histogram_count(last_over_time({phase}{sel}[10m]))"
        got = prom(stack, "/api/v1/query", query=query)["result"]
        out = {r["metric"]["otel_train_rank"]: float(r["value"][1]) for r in got}
        return out if len(out) == run["ranks"] and all(v == STEPS for v in out.values()) else {}

    counts = poll(per_rank, "forward phase counts of every rank")
    assert counts == {str(r): float(STEPS) for r in range(run["ranks"])}


def test_a_ddp_rank_keeps_to_its_series_budget(stack: Any, run: dict[str, Any]) -> None:
    """SERIES_PER_DDP_RANK (tests/series_budget.py): a rank's budget and its collectives'
    histogram (one series per op and group); counted here on each rank of the job (not
    Prometheus's own ALERTS series about it), with the CUDA-only series a GPU rank adds."""

    def per_rank() -> dict[str, set[str]]:
        series = prom(stack, "/api/v1/series", **{
            "match[]": f'{{job="{run["service"]}", __name__!~".*:.*"}}',
            "start": str(run["start"] - 60)})  # fmt: skip
        out: dict[str, set[str]] = {}
        for x in series:
            out.setdefault(x["otel_train_rank"], set()).add(x["__name__"] + str(sorted(x.items())))
        ranks = {str(r) for r in range(run["ranks"])}
        return out if set(out) == ranks else {}

    by_rank = poll(per_rank, f"series of every rank of the {run['ranks']}-rank job")
    aliases = {c.prometheus_base_name(old) for old, _ in c.DEPRECATED_METRICS}
    collectives = c.prometheus_base_name(c.COLLECTIVE_DURATION)
    for rank, series in by_rank.items():
        names = [n for s in series if not (n := s.split("[", 1)[0]).startswith("ALERTS")]
        assert collectives in names, rank  # (DDP's gradient all-reduce)
        count = len([n for n in names if n not in aliases]) + CUDA_ONLY_SERIES
        assert count <= SERIES_PER_DDP_RANK, (rank, sorted(names))


def test_straggler_rule_names_the_slow_rank(stack: Any, run: dict[str, Any]) -> None:
    job = run["service"]

    def alerts() -> list[dict[str, Any]]:
        return [
            a
            for a in prom(stack, "/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == "OtelTrainStraggler"
            and a["labels"].get("job") == job
        ]

    poll(
        lambda: [a for a in alerts() if a["state"] == "firing"],
        "the OtelTrainStraggler alert",
        timeout=60,
    )
    # Only the slowed rank, neither firing nor pending for any other.
    assert {a["labels"]["otel_train_rank"] for a in alerts()} == {str(run["slow"])}
    scores = prom(
        stack, "/api/v1/query", query=f'job_rank:otel_train_straggler_score:min{{job="{job}"}}'
    )["result"]
    by_rank = {r["metric"]["otel_train_rank"]: float(r["value"][1]) for r in scores}
    assert set(by_rank) == {str(r) for r in range(run["ranks"])}
    assert min(by_rank, key=by_rank.__getitem__) == str(run["slow"])
    assert all(v >= 0.7 for r, v in by_rank.items() if r != str(run["slow"]))
    section = prom(
        stack,
        "/api/v1/query",
        query=f'min by (phase) (job_rank_phase:otel_train_straggler_score:ratio{{job="{job}", '
        f'otel_train_rank="{run["slow"]}"}})',
    )["result"]
    worst = min(section, key=lambda r: float(r["value"][1]))
    assert worst["metric"]["phase"] == "forward"
    # The all-reduce makes every rank's step as slow as the straggler's: the step time
    # alone does not tell which rank it is (why the rules also score phases).
    steps = prom(
        stack,
        "/api/v1/query",
        query=f'job_rank:otel_train_step_straggler_score:ratio{{job="{job}"}}',
    )["result"]
    assert len(steps) == run["ranks"]
    assert all(float(r["value"][1]) >= 0.7 for r in steps), steps


@pytest.mark.parametrize(
    ("panel", "expr"),
    dashboard_queries("training-overview"),
    ids=[panel for panel, _ in dashboard_queries("training-overview")],
)
def test_every_overview_query_returns_data_for_the_job(
    stack: Any, run: dict[str, Any], panel: str, expr: str
) -> None:
    assert poll(
        lambda: query_data(stack, expr, run["service"], run["start"]),
        f"data for training-overview / {panel} from the {run['ranks']}-rank job",
        timeout=30,
    )
