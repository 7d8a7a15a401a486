"""The training overview's panels for distributed jobs: each rank's progress age against
its limit, the share of step time each rank waits in each collective, and the hang events
from the log store (VictoriaLogs, LogsQL), each linked to its step's trace in Jaeger."""

from __future__ import annotations

from typing import Any

from widgets import JAEGER_UID, LOGS_TYPE, LOGS_UID, RATE, F, explore_url, n, panel, target

from otel_train import contract as c

LOGS = {"type": LOGS_TYPE, "uid": LOGS_UID}
OP = c.prometheus_label(c.A_COLLECTIVE_OP)
Grid = tuple[int, int, int, int]


def progress_panel(grid: Grid) -> dict[str, Any]:
    p = panel(
        "Progress age by rank",
        [
            target(
                f"max by (otel_train_rank) ({n(c.PROGRESS_AGE)}{{{F}}})",
                "rank {{otel_train_rank}}",
                "A",
            ),
            target(f"min({n(c.PROGRESS_LIMIT)}{{{F}}})", "limit", "B"),
        ],
        "s",
        grid,
        description="Seconds since each rank's training thread last crossed a phase "
        "boundary, read on the exporter's own timer: it keeps rising while the rank is "
        "stuck. Past its limit (hang_after, or the budget of an open evaluation or "
        "checkpoint region; the line is the lowest limit of the selected ranks) a rank is "
        "hung: OtelTrainRankStalled fires and the rank sends an otel_train.hang record "
        "(Hang events, below). OtelTrainRankHoldsJob names the rank its peers wait for.",
    )
    limit = {
        "matcher": {"id": "byName", "options": "limit"},
        "properties": [
            {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
        ],
    }
    p["fieldConfig"]["overrides"].append(limit)
    return p


def collectives_panel(grid: Grid) -> dict[str, Any]:
    waited = f"histogram_sum(rate({n(c.COLLECTIVE_DURATION)}{{{F}}}[{RATE}]))"
    steps = f"histogram_sum(rate({n(c.STEP_DURATION)}{{{F}}}[{RATE}]))"
    share = (
        f"sum by (otel_train_rank, {OP}) ({waited}) "
        f"/ on (otel_train_rank) group_left sum by (otel_train_rank) ({steps})"
    )
    return panel(
        "Time in collectives (share of step time)",
        [target(share, "rank {{otel_train_rank}} {{" + OP + "}}", "A")],
        "percentunit",
        grid,
        description="Share of each rank's step time its training thread spent waiting in "
        "each collective (otel_train.collective.duration: explicit torch.distributed calls, "
        "ddp_all_reduce for DDP's gradient all-reduce). In synchronous training the ranks "
        "wait for the slowest: the rank that waits least while the others wait is the "
        "straggler (the straggler score uses the same split).",
    )


# What the table shows of each record, in order (the resource's rank and node, the
# record's attributes, its trace id), and the heading of each column.
COLUMNS = {
    c.RESOURCE_RANK.key: "rank",
    "event_name": "event",
    c.HANG_SECONDS.key: "seconds",
    c.HANG_AFTER.key: "limit",
    c.STEP_INDEX.key: "step",
    c.PHASE_NAME.key: "phase",
    c.HANG_REGION.key: "region",
    c.COLLECTIVE_OP.key: "collective",
    c.COLLECTIVE_SEQ.key: "seq",
    c.COLLECTIVE_GROUP.key: "group",
    "host.name": "host",
    "trace_id": "trace_id",
    c.HANG_FLIGHT_RECORDER.key: "flight recorder",
    c.HANG_STACKTRACE.key: "stacks",
}


def hang_events_query(job: str = "$job", ranks: str = "${rank:regex}") -> str:
    """LogsQL: the job's otel_train.hang and otel_train.hang.resolved records, newest
    first. VictoriaLogs keeps the resource's attributes as fields: the Prometheus job
    label is rebuilt from them (service.namespace/service.name, or service.name)."""
    events = ", ".join(f'"{e}"' for e in (c.HANG_EVENT, c.HANG_RESOLVED_EVENT))
    return (
        f"event_name:in({events})"
        ' | format if (service.namespace:"") "<service.name>" as job'
        ' | format if (service.namespace:~".") "<service.namespace>/<service.name>" as job'
        f' | filter job:="{job}" {c.RESOURCE_RANK.key}:~"^({ranks})$"'
        f" | fields _time, {', '.join(COLUMNS)}"
        " | sort by (_time desc) | limit 200"
    )


def hang_events_panel(grid: Grid) -> dict[str, Any]:
    query = {"datasource": LOGS, "expr": hang_events_query(), "refId": "A"}
    query.update({"queryType": "instant", "editorMode": "code"})
    p = panel(
        "Hang events",
        [query],
        "short",
        grid,
        kind="table",
        description="The otel_train.hang records of the selected ranks (a rank with no "
        "phase boundary for its limit: at most three per stall) and their "
        "otel_train.hang.resolved records (the stall's total seconds), from VictoriaLogs. "
        "A record names the open step and phase, the collective the rank waits in (its "
        "sequence number: ranks at different numbers did not call the same collective) "
        "and the Python stacks of its threads. Click a trace_id for the step's trace.",
    )
    p["datasource"] = LOGS
    p["options"] = {"showHeader": True, "sortBy": [{"displayName": "Time", "desc": True}]}
    # The plugin returns each record's fields as one JSON "labels" field: spread them out.
    p["transformations"] = [
        {"id": "extractFields", "options": {"source": "labels", "format": "json"}},
        {
            "id": "organize",
            "options": {
                "excludeByName": {"Line": True, "id": True, "labels": True},
                "indexByName": {name: i + 1 for i, name in enumerate(COLUMNS)},
                "renameByName": {k: v for k, v in COLUMNS.items() if k != v},
            },
        },
    ]
    trace = {
        "matcher": {"id": "byName", "options": "trace_id"},
        "properties": [
            {
                "id": "links",
                "value": [
                    {
                        "title": "Step trace in Jaeger",
                        "url": explore_url(JAEGER_UID, {"refId": "A", "query": "${__value.raw}"}),
                    }
                ],
            }
        ],
    }
    p["fieldConfig"]["overrides"].append(trace)
    return p
