"""The provisioned Grafana files: generated from grafana/build.py, valid for Grafana's
provisioning, and querying only metric names the telemetry contract defines."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_train import contract as c

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"


def _build_module() -> Any:
    spec = importlib.util.spec_from_file_location("grafana_build", GRAFANA / "build.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BUILD = _build_module()
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
CONTRACT_NAMES = {name for m in c.METRICS for name in c.prometheus_names(m)}
RULE_FILES = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
RULES = [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]
# Series the recording rules write: dashboards may query them like contract metrics.
RECORDED = {r["record"] for r in RULES if "record" in r}


def all_queries(dash: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in query_variables(dash)]
    return exprs


def query_variables(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in dash["templating"]["list"] if v["type"] == "query"]


def metric_names(expr: str) -> set[str]:
    # A metric name in PromQL stands before a selector "{" or as label_values' first argument.
    names = set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr))
    names |= set(re.findall(r"label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)", expr))
    return names


def test_committed_files_are_the_build_output() -> None:
    for rel, text in BUILD.outputs().items():
        assert (GRAFANA / rel).read_text() == text, f"grafana/{rel} is stale: run make dashboards"


def test_two_dashboards_exist() -> None:
    assert [p.name for p in DASHBOARDS] == ["rl-loop.json", "training-overview.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_queries_use_only_contract_metric_names(path: Path) -> None:
    dash = json.loads(path.read_text())
    used: set[str] = set()
    for expr in all_queries(dash):
        names = metric_names(expr)
        assert names, f"no metric name found in {expr!r}"
        unknown = names - CONTRACT_NAMES - RECORDED
        assert not unknown, (
            f"{path.name}: {sorted(unknown)} are neither in the telemetry contract nor recorded "
            "by deploy/prometheus/rules"
        )
        used |= names
    assert used


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_has_what_grafana_requires(path: Path) -> None:
    dash = json.loads(path.read_text())
    for key in ("uid", "title", "panels", "schemaVersion", "templating"):
        assert key in dash
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", dash["uid"])
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["type"] in {"timeseries", "bargauge", "stat"}
        assert set(p["gridPos"]) == {"x", "y", "w", "h"}
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs))
    names = {v["name"] for v in dash["templating"]["list"]}
    for expr in all_queries(dash):
        for var in re.findall(r"\$(\w+)", expr):
            assert var in names or var.startswith("__"), f"undefined variable ${var}"


def test_datasources_provisioning_and_uids() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/datasources.yaml").read_text())
    assert ds["apiVersion"] == 1
    by_uid = {d["uid"]: d for d in ds["datasources"]}
    for d in ds["datasources"]:
        for key in ("name", "type", "uid", "url", "access"):
            assert d.get(key), f"datasource {d.get('name')} lacks {key}"
    assert by_uid[BUILD.PROM_UID]["type"] == "prometheus"
    assert by_uid[BUILD.JAEGER_UID]["type"] == "jaeger"
    # Thanos query, in Prometheus's network namespace in compose, on its HTTP address.
    thanos = by_uid[BUILD.THANOS_UID]
    assert thanos["type"] == "prometheus"
    compose = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text())
    query = compose["services"]["thanos-query"]
    assert query["network_mode"] == "service:prometheus"
    address = next(a for a in query["command"] if a.startswith("--http-address="))
    assert thanos["url"] == f"http://prometheus:{address.rsplit(':', 1)[1]}"
    for uid in (BUILD.PROM_UID, BUILD.THANOS_UID):
        dest = by_uid[uid]["jsonData"]["exemplarTraceIdDestinations"]
        assert all(x["datasourceUid"] in by_uid for x in dest)
        # Exemplars arrive over OTLP with the trace id in the label Prometheus names trace_id.
        assert {x["name"] for x in dest} == {"trace_id"}
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        # Every query reads the source $datasource picks: one of the Prometheus-type ones,
        # Prometheus by default (Thanos query serves the same PromQL: tests/e2e).
        (source,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
        assert source["name"] == "datasource" and source["query"] == "prometheus"
        assert source["current"]["value"] == BUILD.PROM_UID
        assert {d["uid"] for d in ds["datasources"] if d["type"] == "prometheus"} == {
            BUILD.PROM_UID,
            BUILD.THANOS_UID,
        }
        uids = {p["datasource"]["uid"] for p in dash["panels"]}
        uids |= {t["datasource"]["uid"] for p in dash["panels"] for t in p["targets"]}
        uids |= {v["datasource"]["uid"] for v in query_variables(dash)}
        assert uids == {"${datasource}"}, f"{path.name}: {uids}"


def test_dashboard_provider_points_where_compose_mounts_the_dashboards() -> None:
    prov = yaml.safe_load((GRAFANA / "provisioning/dashboards/dashboards.yaml").read_text())
    assert prov["apiVersion"] == 1
    provider = prov["providers"][0]
    assert provider["type"] == "file" and provider["name"]
    path = provider["options"]["path"]
    compose = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text())
    grafana = next(s for name, s in compose["services"].items() if "grafana" in name)
    mounts = [v.split(":") for v in grafana["volumes"]]
    assert any(target == path and src.endswith("grafana/dashboards") for src, target, *_ in mounts)
    assert any(src.endswith("grafana/provisioning") for src, *_ in mounts)


def test_grafana_opens_on_the_training_dashboard() -> None:
    compose = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text())
    grafana = next(s for name, s in compose["services"].items() if "grafana" in name)
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == "/var/lib/grafana/dashboards/training-overview.json"
    assert (GRAFANA / "dashboards" / Path(home).name).is_file()


def rule_metric_names(expr: str) -> set[str]:
    """Every series name in a rule expression, bare recorded names included."""
    expr = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    words = re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", expr)
    keywords = {"and", "or", "unless", "group_left", "group_right"}
    return {w for w in words if w not in keywords}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.get("record") or r.get("alert"))
def test_rules_use_only_contract_and_recorded_names(rule: dict[str, Any]) -> None:
    names = metric_names(rule["expr"]) | rule_metric_names(rule["expr"])
    assert names
    unknown = names - CONTRACT_NAMES - RECORDED
    assert not unknown, f"{sorted(unknown)} are not contract metrics or recorded series"


def test_the_straggler_panel_reads_a_recorded_score_and_links_to_jaeger() -> None:
    dash = json.loads((GRAFANA / "dashboards" / "training-overview.json").read_text())
    panel = next(p for p in dash["panels"] if p["title"] == "Straggler score by rank")
    assert BUILD.STRAGGLER_SCORE in RECORDED
    assert BUILD.STRAGGLER_SCORE in panel["targets"][0]["expr"]
    alert = next(r for r in RULES if r.get("alert") == "OtelTrainStraggler")
    assert f"< {BUILD.STRAGGLER_THRESHOLD}" in alert["expr"]
    (link,) = panel["fieldConfig"]["defaults"]["links"]
    left = json.loads(link["url"].removeprefix("/explore?left="))
    assert left["datasource"] == BUILD.JAEGER_UID
    query = left["queries"][0]
    assert query["service"] == "${__field.labels.job}"
    assert query["operation"] == c.STEP_SPAN.name
    assert f"{c.RANK.key}=${{__field.labels.otel_train_rank}}" in query["tags"]
    assert f"{c.STEP_SAMPLED_BECAUSE.key}=slowest" in query["tags"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_job_is_one_training_job_over_otlp(path: Path) -> None:
    # Shares and quantiles of two jobs do not mix, and the in-process scrape job
    # (otel-train-inprocess, every series otel_train_source="scrape") is no training job.
    dash = json.loads(path.read_text())
    job = next(v for v in dash["templating"]["list"] if v["name"] == "job")
    assert not job["multi"] and not job["includeAll"] and "allValue" not in job
    assert 'otel_train_source=""' in job["query"]["query"]
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in query_variables(dash) if v["name"] != "job"]
    for expr in exprs:
        assert 'job=~"$job"' not in expr
        if "$job" in expr:
            assert 'job="$job"' in expr, expr


def test_the_rl_dashboard_lists_only_rl_jobs() -> None:
    dash = json.loads((GRAFANA / "dashboards" / "rl-loop.json").read_text())
    job = next(v for v in dash["templating"]["list"] if v["name"] == "job")
    phases = re.search(r'phase=~"([^"]+)"', job["query"]["query"])
    assert phases, job["query"]["query"]
    # Phases a plain loop (data/forward/backward/optimizer) never has.
    assert set(phases.group(1).split("|")) == {"rollout", "train", "weight_sync"}


@pytest.mark.parametrize("derived", c.DERIVED, ids=lambda d: d.name)
def test_derived_figures_read_only_contract_metrics(derived: c.DerivedSpec) -> None:
    """What the contract says Prometheus computes instead of a rank exporting it reads
    series a rank does export (their values: tests/stack and tests/e2e)."""
    names = metric_names(derived.query('job="x"', "otel_train_rank", "5m"))
    assert names and names <= CONTRACT_NAMES, names - CONTRACT_NAMES
