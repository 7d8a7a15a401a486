"""OTLP over the network on loopback: a receiver in the test decodes what otel-train exports,
over HTTP/protobuf (the default) and over gRPC."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.metrics.v1 import metrics_pb2
from otel_helpers import tiny_loader, tiny_model, train_epoch

import otel_train
from otel_train import contract as c


class Sink:
    """What arrived, decoded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.paths: list[str] = []


class HttpReceiver:
    """An OTLP/HTTP (protobuf) receiver on 127.0.0.1:<free port>."""

    def __init__(self) -> None:
        sink = self.sink = Sink()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                assert self.headers.get("Content-Type") == "application/x-protobuf"
                if self.path == "/v1/traces":
                    request: Any = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    reply: Any = trace_service_pb2.ExportTraceServiceResponse()
                    with sink.lock:
                        sink.traces.append(request)
                elif self.path == "/v1/metrics":
                    request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                    reply = metrics_service_pb2.ExportMetricsServiceResponse()
                    with sink.lock:
                        sink.metrics.append(request)
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                with sink.lock:
                    sink.paths.append(self.path)
                payload = reply.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class GrpcReceiver:
    """An OTLP/gRPC receiver (TraceService and MetricsService) on 127.0.0.1:<free port>."""

    def __init__(self) -> None:
        import grpc

        sink = self.sink = Sink()

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                with sink.lock:
                    sink.traces.append(request)
                    sink.paths.append("traces")
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                with sink.lock:
                    sink.metrics.append(request)
                    sink.paths.append("metrics")
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def close(self) -> None:
        self.server.stop(None).wait(5)


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for var in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
    ):
        monkeypatch.delenv(var, raising=False)
    rx = HttpReceiver() if request.param == "http/protobuf" else GrpcReceiver()
    rx.protocol = request.param
    yield rx
    otel_train.shutdown()
    rx.close()


def attrs(kvs: Any) -> dict[str, Any]:
    out = {}
    for kv in kvs:
        field = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, field)
    return out


def test_otlp_export_over_loopback(receiver: Any) -> None:
    model, opt = tiny_model()
    loader = tiny_loader(n=32, batch_size=8)
    otel_train.instrument(
        model,
        optimizer=opt,
        dataloader=loader,
        otlp_endpoint=f"http://127.0.0.1:{receiver.port}",
        otlp_protocol=receiver.protocol,
        prometheus=False,
        trace_steps="all",
        metric_export_interval=0.2,
        console="off",
        service_name="otel-train-test",
    )
    session = otel_train.session.current()
    assert session.telemetry.owned and session.prometheus_address is None
    train_epoch(model, opt, loader)
    otel_train.record(loss=0.25)
    assert otel_train.shutdown(timeout=10.0)  # flushes both pipelines
    sink = receiver.sink
    assert sink.traces and sink.metrics, sink.paths

    # -- traces ---------------------------------------------------------------------------
    spans = []
    for req in sink.traces:
        for rs in req.resource_spans:
            resource = attrs(rs.resource.attributes)
            assert resource["service.name"] == "otel-train-test"
            assert resource[c.RESOURCE_RANK.key] == 0
            for ss in rs.scope_spans:
                assert ss.scope.name == c.SCOPE_NAME
                spans.extend(ss.spans)
    steps = sorted(
        (s for s in spans if s.name == c.STEP_SPAN.name),
        key=lambda s: attrs(s.attributes)[c.STEP_INDEX.key],
    )
    assert len(steps) == 4
    assert len(spans) == 4 * 5
    for i, step in enumerate(steps):
        a = attrs(step.attributes)
        assert a[c.STEP_INDEX.key] == i
        assert a[c.STEP_SAMPLES.key] == 8
        assert a[c.RANK.key] == 0
        assert a[c.STEP_HOST_DURATION.key] > 0
        assert step.parent_span_id == b""
        assert len(step.trace_id) == 16
        kids = sorted(
            (s for s in spans if s.parent_span_id == step.span_id),
            key=lambda s: s.start_time_unix_nano,
        )
        assert [k.name for k in kids] == ["data", "forward", "backward", "optimizer"]
        for k in kids:
            assert k.trace_id == step.trace_id
            ka = attrs(k.attributes)
            assert ka[c.PHASE_NAME.key] == k.name
            assert ka[c.STEP_INDEX.key] == i
            assert ka[c.PHASE_HOST_DURATION.key] > 0
            assert step.start_time_unix_nano <= k.start_time_unix_nano
            assert k.end_time_unix_nano <= step.end_time_unix_nano

    # -- metrics: the last export holds the cumulative totals ----------------------------------
    by_name: dict[str, Any] = {}
    for req in sink.metrics:
        for rm in req.resource_metrics:
            assert attrs(rm.resource.attributes)["service.name"] == "otel-train-test"
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    by_name[m.name] = m  # later exports replace earlier ones
    phase = by_name[c.PHASE_DURATION.name]
    assert phase.unit == "s"
    # Exponential buckets by default: Prometheus stores each as one native histogram.
    assert phase.WhichOneof("data") == "exponential_histogram"
    assert phase.exponential_histogram.aggregation_temporality == (
        metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    )
    points = {attrs(p.attributes)["phase"]: p for p in phase.exponential_histogram.data_points}
    assert set(points) == {"data", "forward", "backward", "optimizer"}
    step_traces = {s.trace_id: s.span_id for s in steps}
    for name, p in points.items():
        assert attrs(p.attributes)["clock"] == "host"
        assert p.count == 4
        assert sum(p.positive.bucket_counts) + p.zero_count == 4
        assert 0 < p.scale <= 3 and not p.negative.bucket_counts
        base = 2**2**-p.scale  # every value lies in its bucket (base**i, base**(i + 1)]
        offset, n = p.positive.offset, len(p.positive.bucket_counts)
        lo, hi = base**offset, base ** (offset + n)
        assert lo < p.min <= p.max <= hi * (1 + 1e-9)
        assert p.sum > 0
        assert p.exemplars, name
        for ex in p.exemplars:
            assert ex.trace_id in step_traces  # links to an exported step trace
            assert ex.span_id == step_traces[ex.trace_id]
    assert by_name[c.STEP_DURATION.name].exponential_histogram.data_points[0].count == 4

    steps_metric = by_name[c.STEPS.name]
    assert steps_metric.sum.is_monotonic
    assert [p.as_double for p in steps_metric.sum.data_points] == [4.0]
    assert [p.as_double for p in by_name[c.SAMPLES.name].sum.data_points] == [32.0]
    assert by_name[c.THROUGHPUT_FLOPS.name].gauge.data_points[0].as_double > 0
    (loss,) = by_name[c.SCALAR.name].gauge.data_points
    assert attrs(loss.attributes) == {"name": "loss"} and loss.as_double == 0.25
    assert [p.as_double for p in by_name[c.SPANS_EMITTED.name].sum.data_points] == [20.0]


def test_delta_temporality_preference_reaches_the_bridged_histograms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta the duration histograms
    are exported as deltas that add up to what was trained, like the SDK's own metrics."""
    for var in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    rx = HttpReceiver()
    try:
        otel_train.configure(
            otlp_endpoint=f"http://127.0.0.1:{rx.port}",
            prometheus=False,
            metric_export_interval=0.1,
            console="off",
        )
        for i in range(12):
            with otel_train.step(samples=2), otel_train.phase("train"):
                pass
            if i % 4 == 3:
                # let the worker take these steps (it works every 0.5 s) and periodic
                # exports fall between them
                time.sleep(0.7)
        assert otel_train.shutdown(timeout=10.0)
    finally:
        rx.close()
    delta = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
    counts = []
    steps_total = []
    for req in rx.sink.metrics:
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == c.PHASE_DURATION.name:
                        hist = m.exponential_histogram
                        assert hist.aggregation_temporality == delta
                        counts += [p.count for p in hist.data_points]
                        # each delta's buckets hold its own steps only
                        assert [sum(p.positive.bucket_counts) for p in hist.data_points] == [
                            p.count for p in hist.data_points
                        ]
                    elif m.name == c.STEPS.name:
                        assert m.sum.aggregation_temporality == delta
                        steps_total += [p.as_double for p in m.sum.data_points]
    assert sum(counts) == 12
    assert len(counts) >= 2  # more than one export carried points
    assert sum(steps_total) == 12


def test_explicit_histograms_when_the_standard_variable_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=explicit_bucket_histogram
    keeps the classic buckets over OTLP (Prometheus then stores them as native histograms
    with custom buckets, deploy/prometheus.yml convert_histograms_to_nhcb)."""
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
                       "explicit_bucket_histogram")  # fmt: skip
    rx = HttpReceiver()
    try:
        otel_train.configure(
            otlp_endpoint=f"http://127.0.0.1:{rx.port}",
            prometheus=False,
            metric_export_interval=0.1,
            console="off",
        )
        for _ in range(3):
            with otel_train.step(samples=2), otel_train.phase("train"):
                pass
        assert otel_train.shutdown(timeout=10.0)
    finally:
        rx.close()
    kinds = {
        m.name: m.WhichOneof("data")
        for req in rx.sink.metrics
        for rm in req.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert kinds[c.STEP_DURATION.name] == kinds[c.PHASE_DURATION.name] == "histogram"
    last = [
        m.histogram.data_points[0]
        for req in rx.sink.metrics
        for rm in req.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == c.STEP_DURATION.name
    ][-1]
    assert list(last.explicit_bounds) == list(c.DURATION_BUCKETS) and last.count == 3
