"""The horizontally scalable store on loopback: a 2-rank job's series through Thanos.

The stack of ``scripts/stack up``: the ranks export over OTLP to the Collector, Prometheus
stores the series and remote-writes everything it stores (the straggler rules' records
too) to Thanos receive; Thanos query serves them. Every query of every dashboard, run as
Grafana runs it over the job's time range, returns from Thanos query the series and the
values it returns from Prometheus (the receive's tenant label aside); the duration
histograms arrive as native histograms with their exemplars, and the dashboards'
variables offer the same jobs and ranks.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from typing import Any

import pytest
from ddp_job import fast_rules, run_ddp
from stack_helpers import DASHBOARDS, dashboard_queries, get_json, poll, prom, running_stack

from otel_train import contract as c

pytestmark = pytest.mark.stack
STORE_LABELS = ("tenant_id",)  # what Thanos receive adds (its replica label is deduplicated)


def thanos(stack: Any, path: str, **params: str) -> Any:
    port = stack["ports"]["THANOS_QUERY_HTTP"]
    body = get_json(f"http://127.0.0.1:{port}{path}?" + urllib.parse.urlencode(params))
    assert body["status"] == "success", body
    return body["data"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    config = fast_rules(tmp_path_factory.mktemp("store-config"))
    run = tmp_path_factory.mktemp("store-stack")
    with running_stack(run, OTEL_TRAIN_STACK_PROMETHEUS_CONFIG=str(config)) as running:
        yield running


@pytest.fixture(scope="module")
def run(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The 2-rank job, and a time range both sides have finished writing."""
    job = run_ddp(stack, tmp_path_factory.mktemp("store-job"), ranks=2, slow=1)
    score = f'job_rank:otel_train_straggler_score:min{{job="{job["service"]}"}}'
    poll(lambda: len(prom(stack, "/api/v1/query", query=score)["result"]) == 2, "the scores")
    time.sleep(3)  # the rules' records of the last samples (1 s groups)
    job["end"] = time.time()

    def caught_up() -> bool:
        # Thanos has the newest samples when every series of the job has, on both sides,
        # its last sample at the same time (a count or a sum passes while one series'
        # newest records are still on their way).
        def newest(get: Any) -> dict[str, float]:
            # A range selector as an instant query returns the raw samples, timestamps kept.
            at = {"query": f'{{job="{job["service"]}"}}[1m]', "time": str(job["end"])}
            return {
                series_key(r): max(t for t, _ in r.get("values", []) + r.get("histograms", []))
                for r in get(stack, "/api/v1/query", **at)["result"]
            }

        mine = newest(prom)
        return bool(mine) and mine == newest(thanos)

    poll(caught_up, "Thanos to hold what Prometheus holds", timeout=90)
    return job


def range_query(get: Any, stack: Any, expr: str, run: dict[str, Any]) -> dict[str, Any]:
    """The panel query with $job = the job and every rank over the job's time range, as
    {labels (the store's own left out): [(t, value or histogram)]}."""
    query = expr.replace("$job", run["service"]).replace("$rank", ".*")
    query = query.replace("$__rate_interval", "1m")
    span = {"start": str(run["start"] - 5), "end": str(run["end"]), "step": "2"}
    out = {}
    for r in get(stack, "/api/v1/query_range", query=query, **span)["result"]:
        points = [(t, float(v)) for t, v in r.get("values", [])]
        points += [(t, json.dumps(h, sort_keys=True)) for t, h in r.get("histograms", [])]
        out[series_key(r)] = points
    return out


def series_key(result: dict[str, Any]) -> str:
    """A query result's series as a key: its labels, the store's own left out."""
    labels = {k: v for k, v in result["metric"].items() if k not in STORE_LABELS}
    return json.dumps(labels, sort_keys=True)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9)
    return bool(a == b)


CASES = [
    (d.stem, p, e) for d in sorted(DASHBOARDS.glob("*.json")) for p, e in dashboard_queries(d.stem)
]


@pytest.mark.parametrize(
    ("dashboard", "panel", "expr"), CASES, ids=[f"{d}:{p}" for d, p, _ in CASES]
)
def test_every_dashboard_query_returns_the_same_from_the_store(
    stack: Any, run: dict[str, Any], dashboard: str, panel: str, expr: str
) -> None:
    want = range_query(prom, stack, expr, run)
    got = range_query(thanos, stack, expr, run)
    if dashboard == "training-overview":  # the DDP job's dashboard: data, not two empties
        assert want, f"{panel}: no data from Prometheus"
    assert got.keys() == want.keys(), panel
    for key, points in want.items():
        assert [t for t, _ in got[key]] == [t for t, _ in points], (panel, key)
        bad = [(t, v, w) for (t, v), (_, w) in zip(got[key], points, strict=True) if not same(v, w)]
        assert not bad, (panel, key, bad[:3])


def test_native_histograms_and_exemplars_arrive_in_the_store(
    stack: Any, run: dict[str, Any]
) -> None:
    job = run["service"]
    for spec in (c.STEP_DURATION, c.PHASE_DURATION):
        name = c.prometheus_base_name(spec)
        at = {"query": f'last_over_time({name}{{job="{job}"}}[10m])', "time": str(run["end"])}
        got = thanos(stack, "/api/v1/query", **at)["result"]
        assert got and all("histogram" in r for r in got), got
        assert {r["metric"]["otel_train_rank"] for r in got} == {"0", "1"}
        assert not thanos(stack, "/api/v1/series", **{"match[]": f'{{__name__="{name}_bucket"}}'})
    step = c.prometheus_base_name(c.STEP_DURATION)
    span = {
        "query": f'{step}{{job="{job}"}}',
        "start": str(run["start"] - 5),
        "end": str(run["end"]),
    }

    def trace_ids(get: Any) -> set[str]:
        return {e["labels"]["trace_id"] for s in get(stack, "/api/v1/query_exemplars", **span)
                for e in s["exemplars"]}  # fmt: skip

    want = trace_ids(prom)
    assert want and trace_ids(thanos) == want


@pytest.mark.parametrize("label", ["job", "otel_train_rank"])
def test_the_variables_offer_the_same_values(stack: Any, run: dict[str, Any], label: str) -> None:
    match = {"match[]": f'{c.prometheus_base_name(c.STEPS)}{{job="{run["service"]}"}}'}
    span = {"start": str(run["start"] - 5), "end": str(run["end"])}
    want = prom(stack, f"/api/v1/label/{label}/values", **match, **span)
    assert want and thanos(stack, f"/api/v1/label/{label}/values", **match, **span) == want
