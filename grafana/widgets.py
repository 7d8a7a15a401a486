"""The building blocks of grafana/build.py's dashboards: data source uids, the filters
every query shares, targets, panels, the $datasource / $job / $rank variables, the
dashboard frame and links into Grafana's Explore."""

from __future__ import annotations

import json
from typing import Any

from otel_train import contract as c

PROM_UID = "otel-train-prometheus"
JAEGER_UID = "otel-train-jaeger"
THANOS_UID = "otel-train-thanos"
LOGS_UID = "otel-train-victorialogs"
LOGS_TYPE = "victoriametrics-logs-datasource"  # the VictoriaLogs Grafana plugin's id
# Every query reads the data source the $datasource variable picks: Prometheus by default,
# or Thanos query where one Prometheus no longer holds every job (docs/scale.md).
PROM = {"type": "prometheus", "uid": "${datasource}"}

# Series ingested over OTLP carry no otel_train_source label; the in-process scrape job
# adds otel_train_source="scrape" (deploy/prometheus.yml), so no series counts twice.
OTLP = 'otel_train_source=""'
# One job at a time: $job is a single value (shares and quantiles of two jobs do not mix).
F = f'job="$job", otel_train_rank=~"$rank", {OTLP}'
RATE = "$__rate_interval"


def n(spec: c.MetricSpec) -> str:
    """The metric's name over OTLP (a histogram's: its one native-histogram series)."""
    return c.prometheus_base_name(spec)


def target(expr: str, legend: str, ref: str, exemplar: bool = False) -> dict[str, Any]:
    return {
        "datasource": PROM,
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
        "exemplar": exemplar,
        "range": True,
    }


def panel(
    title: str,
    targets: list[dict[str, Any]],
    unit: str,
    grid: tuple[int, int, int, int],
    kind: str = "timeseries",
    stacked: bool = False,
    description: str = "",
) -> dict[str, Any]:
    x, y, w, h = grid
    custom: dict[str, Any] = {"lineWidth": 1, "fillOpacity": 30 if stacked else 5}
    if stacked:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": PROM,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom"},
            "tooltip": {"mode": "multi"},
        },
    }


def variables(jobs: str) -> dict[str, Any]:
    """$job: one of the jobs that have ``jobs`` series (OTLP only: the in-process scrape job
    ``otel-train-inprocess`` is no training job); $rank: any of its ranks, All by default."""

    def var(name: str, label: str, query: str, many: bool) -> dict[str, Any]:
        out = {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": PROM,
            "query": {"query": query, "refId": f"var-{name}"},
            "definition": query,
            "refresh": 2,
            "includeAll": many,
            "multi": many,
            "sort": 1,
        }
        if many:
            out["allValue"] = ".*"
            out["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
        return out

    ranks = f'label_values({n(c.STEPS)}{{job="$job", {OTLP}}}, otel_train_rank)'
    source = {
        "name": "datasource",
        "label": "data source",
        "type": "datasource",
        "query": "prometheus",  # the Prometheus-type sources: Prometheus and Thanos
        "current": {"selected": True, "text": "Prometheus", "value": PROM_UID},
        "refresh": 1,
        "hide": 0,
    }
    return {
        "list": [
            source,
            var("job", "service / job", f"label_values({jobs}, job)", many=False),
            var("rank", "rank", ranks, many=True),
        ]
    }


def dashboard(
    uid: str, title: str, panels: list[dict[str, Any]], tags: list[str], jobs: str
) -> dict[str, Any]:
    for i, p in enumerate(panels, start=1):
        p["id"] = i
    return {
        "uid": uid,
        "title": title,
        "tags": ["otel-train", *tags],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": variables(jobs),
        "annotations": {"list": []},
        "links": [
            {
                "title": "Traces in Jaeger",
                "type": "link",
                "targetBlank": True,
                "url": explore_url(
                    JAEGER_UID, {"refId": "A", "queryType": "search", "service": "$job"}
                ),
            },
        ],
        "panels": panels,
    }


def explore_url(datasource: str, query: dict[str, Any], **left: Any) -> str:
    """A link that opens ``query`` on ``datasource`` in Grafana's Explore."""
    state = {"datasource": datasource, "queries": [query], **left}
    return "/explore?left=" + json.dumps(state, separators=(",", ":"))
