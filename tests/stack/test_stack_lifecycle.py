"""`scripts/stack up` / `down` for real, on loopback, on ports picked free for this run.

The module starts the stack once, sends OTLP traces and metrics through the
collector with plain HTTP requests (protobuf bodies built with
opentelemetry-proto), reads them back from Jaeger's /api/v3, from Prometheus and from
Thanos query (Prometheus remote-writes to Thanos receive), and ends with
`scripts/stack down`, checking that no process is left.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "scripts" / "stack"

pb_trace_svc = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
pb_metrics_svc = pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")
from opentelemetry.proto.common.v1 import common_pb2  # noqa: E402
from opentelemetry.proto.metrics.v1 import metrics_pb2  # noqa: E402
from opentelemetry.proto.resource.v1 import resource_pb2  # noqa: E402
from opentelemetry.proto.trace.v1 import trace_pb2  # noqa: E402

SERVICE_NAME = f"otel-train-stack-test-{os.getpid()}"


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _stack(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(STACK), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read()


def _get_json(url: str):
    status, body = _get(url)
    assert status == 200, url
    return json.loads(body)


def _post_protobuf(url: str, message) -> int:
    req = urllib.request.Request(
        url,
        data=message.SerializeToString(),
        method="POST",
        headers={"Content-Type": "application/x-protobuf"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status


def _wait_for(what: str, fn, timeout: float = 30.0, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            last = exc
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last result: {last!r}")


def _resource(rank: int) -> resource_pb2.Resource:
    def attr(key, value):
        if isinstance(value, int):
            return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(int_value=value))
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))

    return resource_pb2.Resource(
        attributes=[
            attr("service.name", SERVICE_NAME),
            attr("service.namespace", "otel-train-tests"),
            attr("service.instance.id", f"{SERVICE_NAME}-rank{rank}"),
            attr("host.name", "stack-test-host"),
            attr("otel_train.job", "stack-test-job"),
            attr("otel_train.rank", rank),
            attr("otel_train.local_rank", rank),
        ]
    )


@pytest.fixture(scope="module")
def stack(stack_bins, stack_module, tmp_path_factory):
    """Env for scripts/stack with a private run dir and free ports; `up` before, `down` after."""
    env = dict(os.environ)
    # (not there yet: `up` makes it)
    env["OTEL_TRAIN_STACK_RUN"] = str(tmp_path_factory.mktemp("stack-run") / "run")
    names = list(stack_module.PORTS)  # TRAINING_METRICS included: the job's /metrics
    ports = dict(zip(names, _free_ports(len(names)), strict=True))
    for name, port in ports.items():
        env[f"OTEL_TRAIN_STACK_{name}_PORT"] = str(port)
    up = _stack(env, "up", "--timeout", "120")
    state_path = Path(env["OTEL_TRAIN_STACK_RUN"]) / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    pids = [svc["pid"] for svc in state.get("services", {}).values()]
    info = {"env": env, "ports": ports, "state": state, "pids": pids, "up": up, "down_done": False}
    try:
        assert up.returncode == 0, f"stack up failed:\n{up.stdout}\n{up.stderr}"
        yield info
    finally:
        if not info["down_done"]:
            _stack(env, "down")


def _base(stack, name):
    return f"http://127.0.0.1:{stack['ports'][name]}"


def test_up_starts_every_process_ready(stack):
    assert set(stack["state"]["services"]) == {
        "otelcol",
        "jaeger",
        "prometheus",
        "thanos-receive",
        "thanos-query",
        "victorialogs",
    }
    status = _stack(stack["env"], "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    assert all(s["alive"] and s["ready"] for s in report["services"].values()), report


def test_up_keeps_its_files_to_this_user(stack):
    """The run dir `up` made is 0700, its state and pid files 0600, its logs too."""
    rd = Path(stack["env"]["OTEL_TRAIN_STACK_RUN"])
    assert stat.S_IMODE(rd.stat().st_mode) == 0o700
    for path in (rd / "state.json", rd / "otelcol.pid", rd / "otelcol.log"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def _listening(pid: int) -> set[str]:
    """``address:port`` of each TCP socket ``pid`` listens on (from /proc, hex decoded)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            addr, port = fields[1].split(":")
            raw = bytes.fromhex(addr)
            words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]  # host order
            ip = ipaddress.ip_address(b"".join(words))
            out.add(f"{ip}:{int(port, 16)}")
    return out


def test_every_process_listens_on_loopback_only(stack):
    """Nothing of the stack is reachable from another host: each port it listens on is
    bound to 127.0.0.1 (Thanos receive's Cap'n Proto port defaults to 0.0.0.0)."""
    for name, svc in stack["state"]["services"].items():
        listening = _listening(svc["pid"])
        assert listening, name
        assert all(a.startswith("127.0.0.1:") for a in listening), (name, listening)


def test_second_up_is_a_no_op(stack):
    again = _stack(stack["env"], "up")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already running" in again.stdout
    state = json.loads((Path(stack["env"]["OTEL_TRAIN_STACK_RUN"]) / "state.json").read_text())
    assert [s["pid"] for s in state["services"].values()] == stack["pids"]


def test_jaeger_and_prometheus_apis_answer(stack, versions):
    status, _ = _get(f"{_base(stack, 'COLLECTOR_HEALTH')}/")
    assert status == 200
    services = _get_json(f"{_base(stack, 'JAEGER_UI')}/api/v3/services")
    assert "services" in services or services == {}, services
    build = _get_json(f"{_base(stack, 'PROMETHEUS')}/api/v1/status/buildinfo")
    assert build["data"]["version"] == versions["PROMETHEUS_VERSION"]
    status, _ = _get(f"{_base(stack, 'PROMETHEUS')}/-/ready")
    assert status == 200
    for name in ("THANOS_RECEIVE_HTTP", "THANOS_QUERY_HTTP"):
        status, _ = _get(f"{_base(stack, name)}/-/ready")
        assert status == 200, name
    status, _ = _get(f"{_base(stack, 'VICTORIALOGS')}/health")
    assert status == 200
    _, metrics = _get(f"{_base(stack, 'VICTORIALOGS')}/metrics")
    assert f'version="victoria-logs-v{versions["VICTORIALOGS_VERSION"]}"'.encode() in metrics
    # Thanos query reads the receive's StoreAPI: it lists it as a store.
    stores = _get_json(f"{_base(stack, 'THANOS_QUERY_HTTP')}/api/v1/stores")["data"]
    receive = f"127.0.0.1:{stack['ports']['THANOS_RECEIVE_GRPC']}"
    assert [s["name"] for s in stores.get("receive", [])] == [receive], stores


def test_the_loopback_build_has_query_apis_and_no_ui(stack):
    # What deploy/README.md says of the stack without Docker: `go install` builds embed no
    # UI assets. Should a build ever carry them, this fails and the README must change.
    status, page = _get(f"{_base(stack, 'JAEGER_UI')}/")
    assert status == 200
    assert b"not compiled with the UI assets" in page, page[:400]
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(f"{_base(stack, 'PROMETHEUS')}/query")
    with err.value:  # close its response
        assert err.value.code == 500
        assert b"index.html: no such file" in err.value.read()
    query = urllib.parse.urlencode({"query": "up"})
    assert _get_json(f"{_base(stack, 'PROMETHEUS')}/api/v1/query?{query}")["status"] == "success"
    # The exceptions: Thanos query's UI and VictoriaLogs's (vmui) are in their Go modules.
    status, page = _get(f"{_base(stack, 'THANOS_QUERY_HTTP')}/")
    assert status == 200 and b"THANOS" in page.upper(), page[:400]
    status, page = _get(f"{_base(stack, 'VICTORIALOGS')}/select/vmui/")
    assert status == 200 and b"<!DOCTYPE html>" in page, page[:400]


def test_prometheus_scrapes_the_training_port_of_this_stack(stack):
    # Two stacks on one machine: each scrapes the /metrics port it hands its job, not 9464.
    def inprocess_targets():
        data = _get_json(f"{_base(stack, 'PROMETHEUS')}/api/v1/targets")["data"]
        return [
            t["scrapeUrl"]
            for t in data["activeTargets"]
            if t["labels"]["job"] == "otel-train-inprocess"
        ]

    urls = _wait_for("the in-process scrape target", inprocess_targets, timeout=30)
    assert urls == [f"http://127.0.0.1:{stack['ports']['TRAINING_METRICS']}/metrics"]


def test_env_points_a_job_at_this_stack(stack):
    out = _stack(stack["env"], "env")
    assert out.returncode == 0, out.stdout + out.stderr
    exports = dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())
    assert exports["OTEL_EXPORTER_OTLP_ENDPOINT"] == _base(stack, "OTLP_HTTP")
    assert exports["OTEL_TRAIN_PROMETHEUS_PORT"] == str(stack["ports"]["TRAINING_METRICS"])


def test_otlp_http_traces_reach_jaeger(stack):
    trace_id = random.randbytes(16)
    now = time.time_ns()
    span = trace_pb2.Span(
        trace_id=trace_id,
        span_id=random.randbytes(8),
        name="train.step",
        kind=trace_pb2.Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=now - 50_000_000,
        end_time_unix_nano=now,
    )
    request = pb_trace_svc.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource=_resource(0),
                scope_spans=[
                    trace_pb2.ScopeSpans(
                        scope=common_pb2.InstrumentationScope(name="stack-test"), spans=[span]
                    )
                ],
            )
        ]
    )
    assert _post_protobuf(f"{_base(stack, 'OTLP_HTTP')}/v1/traces", request) == 200

    api = f"{_base(stack, 'JAEGER_UI')}/api/v3"
    _wait_for(
        "the service in Jaeger",
        lambda: SERVICE_NAME in _get_json(f"{api}/services").get("services", []),
    )
    body = _wait_for("the trace in Jaeger", lambda: _get_json(f"{api}/traces/{trace_id.hex()}"))
    spans = [
        s for rs in body["result"]["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
    ]
    assert [s["name"] for s in spans] == ["train.step"]


def _metrics_request(now: int) -> pb_metrics_svc.ExportMetricsServiceRequest:
    start = now - 10_000_000_000
    cumulative = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    phase = [common_pb2.KeyValue(key="phase", value=common_pb2.AnyValue(string_value="forward"))]
    exemplar = metrics_pb2.Exemplar(
        time_unix_nano=now,
        as_double=0.12,
        trace_id=bytes.fromhex("ab" * 16),
        span_id=bytes.fromhex("cd" * 8),
    )
    metrics = [
        metrics_pb2.Metric(
            name="otel_train.mfu",
            unit="1",
            gauge=metrics_pb2.Gauge(
                data_points=[
                    metrics_pb2.NumberDataPoint(time_unix_nano=now, as_double=0.5, attributes=phase)
                ]
            ),
        ),
        metrics_pb2.Metric(
            name="otel_train.steps",
            unit="{step}",
            sum=metrics_pb2.Sum(
                aggregation_temporality=cumulative,
                is_monotonic=True,
                data_points=[
                    metrics_pb2.NumberDataPoint(
                        start_time_unix_nano=start, time_unix_nano=now, as_int=42
                    )
                ],
            ),
        ),
        metrics_pb2.Metric(
            name="otel_train.phase.duration",
            unit="s",
            histogram=metrics_pb2.Histogram(
                aggregation_temporality=cumulative,
                data_points=[
                    metrics_pb2.HistogramDataPoint(
                        start_time_unix_nano=start,
                        time_unix_nano=now,
                        count=3,
                        sum=0.36,
                        explicit_bounds=[0.1, 0.5, 1.0],
                        bucket_counts=[0, 3, 0, 0],
                        attributes=phase,
                        exemplars=[exemplar],
                    )
                ],
            ),
        ),
        metrics_pb2.Metric(
            name="otel_train.step.duration",
            unit="s",
            exponential_histogram=metrics_pb2.ExponentialHistogram(
                aggregation_temporality=cumulative,
                data_points=[
                    metrics_pb2.ExponentialHistogramDataPoint(
                        start_time_unix_nano=start,
                        time_unix_nano=now,
                        count=3,
                        sum=0.66,
                        scale=3,
                        # OTel bucket i is (2**(i/8), 2**((i+1)/8)]: -19 holds 0.2 to 0.21
                        positive=metrics_pb2.ExponentialHistogramDataPoint.Buckets(
                            offset=-19, bucket_counts=[2, 0, 1]
                        ),
                        exemplars=[exemplar],
                    )
                ],
            ),
        ),
        metrics_pb2.Metric(
            name="otel_train.throughput.flops",
            unit="{flop}/s",
            gauge=metrics_pb2.Gauge(
                data_points=[metrics_pb2.NumberDataPoint(time_unix_nano=now, as_double=1234.5)]
            ),
        ),
    ]
    return pb_metrics_svc.ExportMetricsServiceRequest(
        resource_metrics=[
            metrics_pb2.ResourceMetrics(
                resource=_resource(3),
                scope_metrics=[
                    metrics_pb2.ScopeMetrics(
                        scope=common_pb2.InstrumentationScope(name="stack-test"), metrics=metrics
                    )
                ],
            )
        ]
    )


# OTLP name/unit/type -> Prometheus name under the default translation strategy
# (UnderscoreEscapingWithSuffixes): unit "1" on a gauge adds `_ratio`, `{...}`
# annotations vanish, `/s` becomes `_per_second`, monotonic sums get `_total`.
# Histograms are native histograms under the base name: an exponential one as it is, an
# explicit one converted to custom buckets (convert_histograms_to_nhcb).
EXPECTED_NAMES = {
    "otel_train_mfu_ratio",
    "otel_train_steps_total",
    "otel_train_phase_duration_seconds",
    "otel_train_step_duration_seconds",
    "otel_train_throughput_flops_per_second",
}


def test_otlp_metrics_reach_prometheus_with_promoted_labels(stack):
    now = time.time_ns()
    assert _post_protobuf(f"{_base(stack, 'OTLP_HTTP')}/v1/metrics", _metrics_request(now)) == 200

    prom = _base(stack, "PROMETHEUS")

    def names():
        got = set(_get_json(f"{prom}/api/v1/label/__name__/values")["data"])
        return got if got >= EXPECTED_NAMES else None

    assert _wait_for("the metric names in Prometheus", names) >= EXPECTED_NAMES

    query = urllib.parse.quote("otel_train_steps_total")
    result = _get_json(f"{prom}/api/v1/query?query={query}")["data"]["result"]
    assert len(result) == 1, result
    labels = result[0]["metric"]
    assert result[0]["value"][1] == "42"
    assert labels["job"] == f"otel-train-tests/{SERVICE_NAME}"
    assert labels["instance"] == f"{SERVICE_NAME}-rank3"
    assert labels["service_name"] == SERVICE_NAME
    assert labels["host_name"] == "stack-test-host"
    assert labels["otel_train_job"] == "stack-test-job"
    assert labels["otel_train_rank"] == "3"
    assert labels["otel_train_local_rank"] == "3"
    # OTLP-ingested series never carry the scrape marker (double-counting rule)
    assert "otel_train_source" not in labels


def _query(base: str, expr: str) -> list:
    return _get_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")["data"][
        "result"
    ]


def test_histograms_are_stored_as_native_histograms(stack):
    prom = _base(stack, "PROMETHEUS")
    (step,) = _wait_for(
        "the step histogram", lambda: _query(prom, "otel_train_step_duration_seconds")
    )
    # [timestamp, {"count", "sum", "buckets": [[boundary rule, lower, upper, count], ...]}]
    hist = step["histogram"][1]
    assert (hist["count"], float(hist["sum"])) == ("3", 0.66)
    # Prometheus bucket i is (2**((i-1)/8), 2**(i/8)]: the OTel offset -19 is index -18
    bounds = [(float(b[1]), float(b[2]), b[3]) for b in hist["buckets"]]
    assert [(pytest.approx(lo), pytest.approx(hi), n) for lo, hi, n in bounds] == [
        (2 ** (-19 / 8), 2 ** (-18 / 8), "2"),
        (2 ** (-17 / 8), 2 ** (-16 / 8), "1"),
    ]
    (phase,) = _query(prom, "otel_train_phase_duration_seconds")
    uppers = [float(b[2]) for b in phase["histogram"][1]["buckets"]]
    assert uppers == [0.5], uppers  # custom buckets: the explicit bounds, only filled ones
    assert not _query(prom, '{__name__=~"otel_train_phase_duration_seconds_(bucket|sum|count)"}')


def _exemplars(base: str, expr: str) -> list:
    start, end = time.time() - 600, time.time() + 60
    query = urllib.parse.urlencode({"query": expr, "start": start, "end": end})
    data = _get_json(f"{base}/api/v1/query_exemplars?{query}")["data"]
    return [e for series in data for e in series["exemplars"]]


@pytest.mark.parametrize(
    "name", ["otel_train_phase_duration_seconds", "otel_train_step_duration_seconds"]
)
def test_exemplars_are_stored(stack, name):
    found = _wait_for("the exemplar", lambda: _exemplars(_base(stack, "PROMETHEUS"), name))
    assert found[0]["labels"]["trace_id"] == "ab" * 16


def test_series_reach_the_store_through_remote_write(stack):
    """What Prometheus stores reaches Thanos receive by remote write, native histograms and
    exemplars included, and Thanos query answers as Prometheus does, with the receive's
    tenant label added (its replica label is deduplicated away)."""
    thanos = _base(stack, "THANOS_QUERY_HTTP")

    def steps():
        return _query(thanos, "otel_train_steps_total")

    (got,) = _wait_for("the counter in Thanos", steps, timeout=60)
    (want,) = _query(_base(stack, "PROMETHEUS"), "otel_train_steps_total")
    assert got["value"][1] == want["value"][1] == "42"
    assert got["metric"].pop("tenant_id") == "default-tenant"
    assert got["metric"] == want["metric"]
    (step,) = _wait_for(
        "the native histogram in Thanos",
        lambda: _query(thanos, "otel_train_step_duration_seconds"),
        timeout=60,
    )
    assert step["histogram"][1]["count"] == "3"
    found = _wait_for(
        "the exemplar in Thanos",
        lambda: _exemplars(thanos, "otel_train_step_duration_seconds"),
        timeout=60,
    )
    assert found[0]["labels"]["trace_id"] == "ab" * 16


def _gauges(now: int, rows: list[tuple[str, str, dict[str, str], float]]) -> list:
    def point(attrs: dict[str, str], value: float) -> metrics_pb2.NumberDataPoint:
        kvs = [common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(string_value=v))
               for k, v in attrs.items()]  # fmt: skip
        return metrics_pb2.NumberDataPoint(time_unix_nano=now, as_double=value, attributes=kvs)

    return [
        metrics_pb2.Metric(
            name=name, unit=unit, gauge=metrics_pb2.Gauge(data_points=[point(attrs, value)])
        )
        for name, unit, attrs, value in rows
    ]


def test_the_contracts_derived_figures_compute_in_prometheus(stack):
    """The figures no rank exports (contract.DERIVED) come out of the real Prometheus from
    the series a GPU rank sends: phase memory utilization from the reserved peak and the
    device limit, the device's peak from achieved FLOP/s and MFU (with its dtype)."""
    from otel_train import contract as c

    now = time.time_ns()
    rows = [
        (c.PHASE_MEMORY_PEAK.name, "By", {"phase": "forward", "kind": "reserved"}, 3e10),
        (c.PHASE_MEMORY_PEAK.name, "By", {"phase": "forward", "kind": "allocated"}, 2e10),
        (c.PHASE_MEMORY_PEAK.name, "By", {"phase": "backward", "kind": "reserved"}, 6e10),
        (c.DEVICE_MEMORY_LIMIT.name, "By", {c.A_HW_ID: "GPU-0"}, 8e10),
        (c.THROUGHPUT_FLOPS.name, "{flop}/s", {}, 2e14),
        (c.MFU.name, "1", {"dtype": "bf16"}, 0.25),
    ]
    request = pb_metrics_svc.ExportMetricsServiceRequest(
        resource_metrics=[
            metrics_pb2.ResourceMetrics(
                resource=_resource(5),
                scope_metrics=[metrics_pb2.ScopeMetrics(metrics=_gauges(now, rows))],
            )
        ]
    )
    assert _post_protobuf(f"{_base(stack, 'OTLP_HTTP')}/v1/metrics", request) == 200
    prom, sel = _base(stack, "PROMETHEUS"), 'otel_train_rank="5"'

    def derived(d):
        return _wait_for(d.name, lambda: _query(prom, d.query(sel, "otel_train_rank", "5m")))

    util = derived(c.DERIVED_PHASE_MEMORY_UTILIZATION)
    assert {r["metric"]["phase"]: float(r["value"][1]) for r in util} == {
        "forward": pytest.approx(0.375),
        "backward": pytest.approx(0.75),
    }
    (peak,) = derived(c.DERIVED_DEVICE_PEAK_FLOPS)
    assert peak["metric"] == {"otel_train_rank": "5", "dtype": "bf16"}
    assert float(peak["value"][1]) == pytest.approx(8e14)


def test_down_leaves_no_process(stack):
    pids = stack["pids"]
    assert len(pids) == 6
    down = _stack(stack["env"], "down")
    stack["down_done"] = True
    assert down.returncode == 0, down.stdout + down.stderr
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists():  # a zombie waiting for its reaper is not a running process
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
            assert state in ("Z", "X"), f"pid {pid} still running (state {state})"
    run = Path(stack["env"]["OTEL_TRAIN_STACK_RUN"])
    assert not (run / "state.json").exists()
    assert not list(run.glob("*.pid"))
    for port in stack["ports"].values():
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still accepts connections"
    status = _stack(stack["env"], "status")
    assert status.returncode == 3, status.stdout
