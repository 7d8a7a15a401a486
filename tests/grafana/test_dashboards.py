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
    """Every PromQL query: the Prometheus-type targets' and the variables'."""
    exprs = [t["expr"] for t in targets(dash, "prometheus")]
    exprs += [v["query"]["query"] for v in query_variables(dash)]
    return exprs


def targets(dash: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The panel targets that query a data source of type ``kind``."""
    return [t for p in dash["panels"] for t in p["targets"] if t["datasource"]["type"] == kind]


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
        assert p["type"] in {"timeseries", "bargauge", "stat", "table"}
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
        prom = [p for p in dash["panels"] if p["datasource"]["type"] == "prometheus"]
        uids = {p["datasource"]["uid"] for p in prom}
        uids |= {t["datasource"]["uid"] for t in targets(dash, "prometheus")}
        uids |= {v["datasource"]["uid"] for v in query_variables(dash)}
        assert uids == {"${datasource}"}, f"{path.name}: {uids}"
        # The other panels read the log store, by its fixed uid: the one source of its type.
        others = [p for p in dash["panels"] if p not in prom]
        logs = {(p["datasource"]["type"], p["datasource"]["uid"]) for p in others}
        logs |= {
            (t["datasource"]["type"], t["datasource"]["uid"]) for p in others for t in p["targets"]
        }
        assert logs <= {(BUILD.LOGS_TYPE, BUILD.LOGS_UID)}, logs
        assert {d["uid"] for d in ds["datasources"] if d["type"] == BUILD.LOGS_TYPE} == {
            BUILD.LOGS_UID
        }


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
    exprs = [t["expr"] for t in targets(dash, "prometheus")]
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


OVERVIEW = ROOT / "grafana" / "dashboards" / "training-overview.json"


def overview_panel(title: str) -> dict[str, Any]:
    dash = json.loads(OVERVIEW.read_text())
    return next(p for p in dash["panels"] if p["title"] == title)  # type: ignore[no-any-return]


def test_victorialogs_is_provisioned_with_trace_links_to_jaeger() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/datasources.yaml").read_text())
    (logs,) = [d for d in ds["datasources"] if d["uid"] == BUILD.LOGS_UID]
    assert logs["type"] == "victoriametrics-logs-datasource"  # the plugin's id
    # The compose service, on the port it listens on.
    compose = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text())
    flags = dict(a.split("=", 1) for a in compose["services"]["victorialogs"]["command"])
    assert logs["url"] == f"http://victorialogs:{flags['-httpListenAddr'].rsplit(':', 1)[1]}"
    # A record's trace_id field (VictoriaLogs stores the OTLP trace id as hex there) opens
    # the trace in Jaeger. Grafana expands $VAR in provisioning files: $$ is a literal $.
    (link,) = logs["jsonData"]["derivedFields"]
    assert link["matcherType"] == "label" and link["matcherRegex"] == "trace_id"
    assert link["datasourceUid"] == BUILD.JAEGER_UID
    raw = (GRAFANA / "provisioning/datasources/datasources.yaml").read_text()
    assert 'url: "$${__value.raw}"' in raw


def test_the_hang_events_table_reads_contract_names_and_links_to_the_trace() -> None:
    panel = overview_panel("Hang events")
    assert panel["type"] == "table"
    (query,) = panel["targets"]
    assert query["datasource"]["type"] == BUILD.LOGS_TYPE and query["queryType"] == "instant"
    expr = query["expr"]
    events = re.search(r"event_name:in\(([^)]*)\)", expr)
    assert events and set(re.findall(r'"([^"]+)"', events.group(1))) == set(c.LOG_EVENTS)
    fields = re.search(r"\| fields ([^|]+)", expr)
    assert fields
    shown = {f.strip() for f in fields.group(1).split(",")}
    attributes = {a.key for _, _, specs in c.LOG_EVENTS.values() for a in specs}
    resource = {a.key for a in c.RESOURCE_ATTRIBUTES}
    # VictoriaLogs's own fields for a record's time, event name and trace id.
    assert shown - attributes - resource == {"_time", "event_name", "trace_id"}, shown
    assert attributes <= shown  # every attribute of both events has its column
    assert 'job:="$job"' in expr and "${rank:regex}" in expr
    (override,) = [
        o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "trace_id"
    ]
    (link,) = override["properties"][0]["value"]
    left = json.loads(link["url"].removeprefix("/explore?left="))
    assert left["datasource"] == BUILD.JAEGER_UID
    assert left["queries"][0]["query"] == "${__value.raw}"  # Jaeger's trace-id query


def test_the_progress_and_collective_panels_read_their_contract_metrics() -> None:
    progress = [t["expr"] for t in overview_panel("Progress age by rank")["targets"]]
    assert [metric_names(e) for e in progress] == [
        {c.prometheus_base_name(c.PROGRESS_AGE)},
        {c.prometheus_base_name(c.PROGRESS_LIMIT)},
    ]
    (share,) = overview_panel("Time in collectives (share of step time)")["targets"]
    names = {c.prometheus_base_name(m) for m in (c.COLLECTIVE_DURATION, c.STEP_DURATION)}
    assert metric_names(share["expr"]) == names
    # One line per rank and op: the op attribute's label, as Prometheus names it over OTLP.
    op = c.prometheus_label(c.A_COLLECTIVE_OP)
    assert f"by (otel_train_rank, {op})" in share["expr"]
    assert f"{{{{{op}}}}}" in share["legendFormat"]


def test_the_verdicts_panel_says_the_verdicts_words_and_turns_red_at_their_thresholds() -> None:
    from otel_train.processing.verdicts import ADVICE
    from otel_train.settings.verdicts import VerdictSettings

    dash = json.loads((GRAFANA / "dashboards" / "training-overview.json").read_text())
    panel = next(p for p in dash["panels"] if p["title"] == "Verdicts: the bottleneck")
    limits = VerdictSettings()
    want = {"input-bound": limits.verdict_data_stall, "collectives": limits.verdict_collectives,
            "memory near the limit": limits.verdict_memory,
            "telemetry drops": limits.verdict_dropped}  # fmt: skip
    rules = {t["refId"]: t["legendFormat"] for t in panel["targets"]}
    assert sorted(rules.values()) == sorted(want)
    for rule in want:
        assert f"{rule} (red from {want[rule]:g}): try {ADVICE[rule]}" in panel["description"]
    for override in panel["fieldConfig"]["overrides"]:
        rule = rules[override["matcher"]["options"]]
        (steps,) = [p["value"]["steps"] for p in override["properties"] if p["id"] == "thresholds"]
        assert steps[-1] == {"color": "red", "value": want[rule]}


def test_the_straggler_alert_says_what_the_straggler_verdict_says() -> None:
    from otel_train.processing.verdicts import ADVICE

    alert = next(r for r in RULES if r.get("alert") == "OtelTrainStraggler")
    assert f"try {ADVICE['straggler']}." in alert["annotations"]["description"]


VERDICT_ALERTS = {  # alert: (verdict rule, its threshold setting)
    "OtelTrainInputBound": ("input-bound", "verdict_data_stall"),
    "OtelTrainCollectivesShare": ("collectives", "verdict_collectives"),
    "OtelTrainMemoryNearLimit": ("memory near the limit", "verdict_memory"),
    "OtelTrainTelemetryDropped": ("telemetry drops", "verdict_dropped"),
}


@pytest.mark.parametrize("alert", sorted(VERDICT_ALERTS))
def test_the_verdict_alerts_say_their_verdicts_words_at_their_thresholds(alert: str) -> None:
    from otel_train.processing.verdicts import ADVICE
    from otel_train.settings.verdicts import VerdictSettings

    rule, setting = VERDICT_ALERTS[alert]
    threshold = getattr(VerdictSettings(), setting)
    (spec,) = [r for r in RULES if r.get("alert") == alert]
    assert spec["expr"].rstrip().endswith(f">= {threshold:g}")
    description = spec["annotations"]["description"]
    assert description.startswith(f"{rule}: ")
    assert f"({setting} {threshold:g})" in description
    assert description.endswith(f"try {ADVICE[rule]}")
