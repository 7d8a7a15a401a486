"""The stack's side of a hang, with real OTLP from the OpenTelemetry SDK (no training job):
log records, gauges and histograms in the contract's form go through the real Collector
started from deploy/ into VictoriaLogs and Prometheus, as a 2-rank job's would when rank 1
stalls outside any collective and rank 0 waits for it inside an all-reduce.

Then VictoriaLogs holds the otel_train.hang and otel_train.hang.resolved records, found by
the training dashboard's own LogsQL query with their event name, attributes, resource
attributes and the trace id of the step that was open (a trace Jaeger holds); Prometheus
fires OtelTrainRankStalled for both ranks and names rank 1 as the one holding the job; the
dashboard's progress and collective panels return data.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from stack_helpers import (
    dashboard_queries,
    log_records,
    poll,
    prom,
    query_data,
    running_stack,
)

from otel_train import contract as c

pytestmark = pytest.mark.stack
HANG_AFTER = 3.0  # short, so the test is too
STACK = 'Thread 0x7f (most recent call first):\n  File "train.py", line 12 in <module>\n'
STACK += "    time.sleep(30)"
# What each rank's record says: rank 1 stalled in its forward, rank 0 inside the all-reduce.
RECORDS = {
    0: {c.PHASE_NAME.key: "backward", c.COLLECTIVE_OP.key: "all_reduce",
        c.COLLECTIVE_SEQ.key: 31, c.COLLECTIVE_GROUP.key: "default_pg"},
    1: {c.PHASE_NAME.key: "forward"},
}  # fmt: skip


class Rank:
    """One simulated rank: its own resource, and the SDK's OTLP/HTTP exporters of all
    three signals pointed at the Collector."""

    def __init__(self, stack: Any, job: str, rank: int) -> None:
        base = f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}"
        self.rank, self.stalled_at = rank, time.time()
        self.resource = Resource.create(
            {
                "service.name": job,
                "service.instance.id": f"{job}-{rank}",
                c.RESOURCE_RANK.key: rank,
                c.RESOURCE_WORLD_SIZE.key: 2,
            }
        )
        exponential = {Histogram: ExponentialBucketHistogramAggregation(max_scale=3)}
        exporter = OTLPMetricExporter(f"{base}/v1/metrics", preferred_aggregation=exponential)
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=500)
        self.meters = MeterProvider([reader], resource=self.resource)
        self.logs = LoggerProvider(resource=self.resource)
        self.logs.add_log_record_processor(
            SimpleLogRecordProcessor(OTLPLogExporter(f"{base}/v1/logs"))
        )
        self.traces = TracerProvider(resource=self.resource)
        self.traces.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(f"{base}/v1/traces")))
        meter = self.meters.get_meter(c.SCOPE_NAME)
        for spec, value in (
            (c.PROGRESS_AGE, lambda: time.time() - self.stalled_at),
            (c.PROGRESS_LIMIT, lambda: HANG_AFTER),
            (c.COLLECTIVE_WAITING, lambda: float(c.COLLECTIVE_OP.key in RECORDS[rank])),
        ):
            meter.create_observable_gauge(
                spec.name, [self.gauge(value)], unit=spec.unit, description=spec.description
            )
        self.step = meter.create_histogram(c.STEP_DURATION.name, unit=c.STEP_DURATION.unit)
        self.waits = meter.create_histogram(
            c.COLLECTIVE_DURATION.name, unit=c.COLLECTIVE_DURATION.unit
        )

    @staticmethod
    def gauge(value: Any) -> Any:
        def callback(options: CallbackOptions) -> Iterator[Observation]:
            yield Observation(value())

        return callback

    def train_and_stall(self) -> str:
        """A few steps (rank 0 waits 40 ms of each 100 ms in the all-reduce), then the stall
        in a traced step; its hang record, then the resolved one. Returns the trace id."""
        op = {c.A_COLLECTIVE_OP: "all_reduce", c.A_COLLECTIVE_GROUP: "default_pg"}
        for i in range(20):  # over a few exports: a rate needs two samples apart
            self.step.record(0.1)
            self.waits.record(0.04 if self.rank == 0 else 0.001, op)
            time.sleep(0.6 if i % 5 == 4 else 0)  # the exports are 0.5 s apart
        self.stalled_at = time.time()
        logger = self.logs.get_logger(c.SCOPE_NAME)
        with self.traces.get_tracer(c.SCOPE_NAME).start_as_current_span(c.STEP_SPAN.name) as span:
            attributes = {c.HANG_SECONDS.key: 3.5, c.HANG_AFTER.key: HANG_AFTER}
            attributes.update({c.STEP_INDEX.key: 20, c.HANG_STACKTRACE.key: STACK})
            logger.emit(
                event_name=c.HANG_EVENT,
                severity_number=SeverityNumber.WARN,
                severity_text="WARN",
                body=f"otel-train: rank {self.rank} made no progress for 3.5 s",
                attributes={**attributes, **RECORDS[self.rank]},
            )
            resolved = {c.HANG_SECONDS.key: 40.25, c.STEP_INDEX.key: 20}
            logger.emit(
                event_name=c.HANG_RESOLVED_EVENT,
                severity_number=SeverityNumber.INFO,
                severity_text="INFO",
                attributes=resolved,
            )
            return format(span.get_span_context().trace_id, "032x")

    def close(self) -> None:
        for provider in (self.meters, self.logs, self.traces):
            provider.shutdown()


@pytest.fixture(scope="module")
def hang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with running_stack(tmp_path_factory.mktemp("hang-stack")) as stack:
        job, start = f"hang-{uuid.uuid4().hex[:8]}", time.time()
        ranks = [Rank(stack, job, r) for r in (0, 1)]
        try:
            traces = {r.rank: r.train_and_stall() for r in ranks}
            yield {"stack": stack, "job": job, "start": start, "traces": traces, "ranks": ranks}
        finally:
            for r in ranks:
                r.close()


def hang_events(hang: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's Hang events query as Grafana sends it: $job, and All ranks."""
    ((_, expr),) = dashboard_queries("training-overview", logs=True)
    query = expr.replace("$job", hang["job"]).replace("${rank:regex}", ".*")
    return log_records(hang["stack"], query)


def test_the_dashboards_query_finds_the_records_with_their_attributes(hang: dict) -> None:
    poll(lambda: len(hang_events(hang)) == 4, "4 records")
    records = hang_events(hang)
    by = {(r[c.RESOURCE_RANK.key], r["event_name"]): r for r in records}
    assert set(by) == {(str(r), e) for r in (0, 1) for e in (c.HANG_EVENT, c.HANG_RESOLVED_EVENT)}
    for rank, expected in RECORDS.items():
        record = by[(str(rank), c.HANG_EVENT)]
        # VictoriaLogs keeps every attribute under its key, its value as text.
        sent = {c.HANG_SECONDS.key: "3.5", c.HANG_AFTER.key: "3", c.STEP_INDEX.key: "20"}
        sent |= {k: str(v) for k, v in expected.items()} | {c.HANG_STACKTRACE.key: STACK}
        assert {k: record[k] for k in sent} == sent
        assert c.COLLECTIVE_OP.key in record or c.COLLECTIVE_OP.key not in expected
        # The open step's trace: the record's hex trace id, which Jaeger holds.
        assert record["trace_id"] == hang["traces"][rank]
        poll(
            lambda t=record["trace_id"]: jaeger_has(hang["stack"], t), f"trace {record['trace_id']}"
        )
        resolved = by[(str(rank), c.HANG_RESOLVED_EVENT)]
        assert resolved[c.HANG_SECONDS.key] == "40.25"


def jaeger_has(stack: Any, trace_id: str) -> bool:
    url = f"http://127.0.0.1:{stack['ports']['JAEGER_UI']}/api/v3/traces/{trace_id}"
    with urllib.request.urlopen(url, timeout=5) as r:  # 404 (an error) until it is there
        return bool(r.status == 200)


def test_records_keep_severity_and_resource_as_stream_fields(hang: dict) -> None:
    query = f'event_name:="{c.HANG_EVENT}" service.name:="{hang["job"]}"'
    records = poll(lambda: len(log_records(hang["stack"], query)) == 2, "2 hang records")
    records = log_records(hang["stack"], query)
    for r in records:
        assert (r["severity_text"], r["severity_number"]) == (
            "WARN",
            str(SeverityNumber.WARN.value),
        )
        # One stream per rank: the resource's attributes and the event name.
        assert f'{c.RESOURCE_RANK.key}="{r[c.RESOURCE_RANK.key]}"' in r["_stream"]
        assert f'event_name="{c.HANG_EVENT}"' in r["_stream"]
        assert r["scope.name"] == c.SCOPE_NAME


def alerts(hang: dict, name: str) -> set[str]:
    return {
        a["labels"]["otel_train_rank"]
        for a in prom(hang["stack"], "/api/v1/alerts")["alerts"]
        if a["labels"]["alertname"] == name and a["labels"].get("job") == hang["job"]
        and a["state"] == "firing"
    }  # fmt: skip


def test_both_ranks_stall_and_rank_1_holds_the_job(hang: dict) -> None:
    assert poll(lambda: alerts(hang, "OtelTrainRankStalled") == {"0", "1"}, "both stalled")
    assert poll(lambda: alerts(hang, "OtelTrainRankHoldsJob") == {"1"}, "rank 1 holds")
    holding = prom(
        hang["stack"], "/api/v1/query", query="job_rank:otel_train_progress_age_seconds:holding"
    )
    mine = [r for r in holding["result"] if r["metric"]["job"] == hang["job"]]
    assert [r["metric"]["otel_train_rank"] for r in mine] == ["1"]
    assert float(mine[0]["value"][1]) > HANG_AFTER


@pytest.mark.parametrize(
    ("panel", "expr"),
    [
        q
        for q in dashboard_queries("training-overview")
        if q[0].startswith(("Progress age by rank", "Time in collectives"))
    ],
)
def test_the_progress_and_collective_panels_have_data(hang: dict, panel: str, expr: str) -> None:
    series = poll(lambda: query_data(hang["stack"], expr, hang["job"], hang["start"]), panel)
    if panel.startswith("Time in collectives"):
        share = {s["metric"]["otel_train_rank"]: peak(s) for s in series}
        assert share == {"0": pytest.approx(0.4), "1": pytest.approx(0.01)}  # 40 ms, 1 ms of 100


def peak(series: dict[str, Any]) -> float:
    return max(float(v) for _, v in series["values"] if v not in ("NaN", "+Inf", "-Inf"))
