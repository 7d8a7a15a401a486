"""Replay the telemetry of N simulated ranks into the real Collector, and measure it.

The shapes are real: a short training loop instrumented by otel-train (plain PyTorch loop,
DataLoader, SGD, one user scalar) runs once against in-memory providers; its step trace
(step span + phase spans) and one metric collection are encoded with the SDK's own OTLP
encoder. Each simulated rank then sends that payload under its own resource (rank, local
rank, node, instance id, job), with fresh timestamps and trace ids, on otel-train's default
schedule:

- metrics: one cumulative export per ``--interval`` seconds (metric_export_interval, 10 s);
- traces at default sampling (trace_steps=sampled): the first step at start, then one
  trace per sampling window, min(trace_window x step time, trace_window_seconds) =
  min(1000 x ``--step-seconds``, 60) seconds.

It starts the stack from deploy/ (scripts/stack up) on free loopback ports in a temporary
run dir and stops it at the end. For each rank count it holds the load for ``--hold``
seconds and reports, from the Collector's own metrics: points and spans accepted, refused
(the memory limiter) and failed to send (exporters), the exporters' queue size; the
generator's HTTP errors and whether it kept the schedule; CPU used by the Collector and
Prometheus; and from Prometheus the series per rank. Bounded: at most 20000 ranks and
``--max-seconds`` in all; loopback only.

Usage: python benchmarks/loadgen.py [--ranks 250,500,1000] [--hold 30] [--interval 10]
                                   [--per-request 1] [--step-seconds 1]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import copy
import http.client
import importlib.machinery
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import torch
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import encode_spans
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from prometheus_client.parser import text_string_to_metric_families

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

ROOT = Path(__file__).resolve().parents[1]
STACK = [sys.executable, str(ROOT / "scripts" / "stack")]
MAX_RANKS = 20_000
RANKS_PER_NODE = 8


# --- real shapes ---------------------------------------------------------------------------


def capture_shapes() -> tuple[Any, Any]:
    """(one step trace, one metric collection) of a real instrumented loop, as OTLP protobuf."""
    tel = InMemoryTelemetry()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(16, 32), torch.randint(0, 4, (16,))) for _ in range(8)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    otel_train.instrument(
        model,
        optimizer=opt,
        dataloader=loader,
        tracer_provider=tel.tracer_provider,
        meter_provider=tel.meter_provider,
        trace_steps="all",
        console="off",
    )
    for _ in range(3):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            otel_train.record(loss=loss.detach())
    assert otel_train.shutdown(), "shutdown missed its deadline"
    spans = tel.spans()
    last = max(s.context.trace_id for s in spans if s.name == c.STEP_SPAN.name)
    trace = encode_spans([s for s in spans if s.context.trace_id == last])
    metrics = encode_metrics(tel.reader.get_metrics_data())
    return trace, metrics


def kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def rank_resource(service: str, job: str, rank: int, world: int) -> list[KeyValue]:
    attrs = {
        "service.name": service,
        "service.instance.id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{job}/{rank}")),
        "host.name": f"node-{rank // RANKS_PER_NODE:05d}",
        c.RESOURCE_RANK.key: rank,
        c.RESOURCE_LOCAL_RANK.key: rank % RANKS_PER_NODE,
        c.RESOURCE_WORLD_SIZE.key: world,
        c.RESOURCE_NODE_RANK.key: rank // RANKS_PER_NODE,
        c.RESOURCE_JOB.key: job,
    }
    return [kv(k, v) for k, v in attrs.items()]


def _points(metric: Any) -> Any:
    kind = metric.WhichOneof("data")
    return getattr(metric, kind).data_points


class SimRank:
    """One simulated rank: the captured payloads under its own resource."""

    def __init__(self, trace: Any, metrics: Any, resource: list[KeyValue], start_ns: int):
        self.metrics = copy.deepcopy(metrics)
        self.trace = copy.deepcopy(trace)
        for rm in self.metrics.resource_metrics:
            del rm.resource.attributes[:]
            rm.resource.attributes.extend(resource)
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in _points(m):
                        p.start_time_unix_nano = start_ns
        for rs in self.trace.resource_spans:
            del rs.resource.attributes[:]
            rs.resource.attributes.extend(resource)

    def metrics_body(self, now_ns: int) -> bytes:
        for rm in self.metrics.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in _points(m):
                        p.time_unix_nano = now_ns
        return self.metrics.SerializeToString()  # type: ignore[no-any-return]

    def trace_body(self, now_ns: int) -> bytes:
        spans = [s for rs in self.trace.resource_spans for ss in rs.scope_spans for s in ss.spans]
        shift = now_ns - max(s.end_time_unix_nano for s in spans)
        trace_id = random.randbytes(16)
        ids = {s.span_id: random.randbytes(8) for s in spans}
        for s in spans:
            s.trace_id = trace_id
            s.span_id = ids[s.span_id]
            if s.parent_span_id:
                s.parent_span_id = ids[s.parent_span_id]
            s.start_time_unix_nano += shift
            s.end_time_unix_nano += shift
        return self.trace.SerializeToString()  # type: ignore[no-any-return]


def count_payload(metrics: Any, trace: Any) -> tuple[int, int]:
    points = sum(
        len(_points(m))
        for rm in metrics.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )
    spans = sum(len(ss.spans) for rs in trace.resource_spans for ss in rs.scope_spans)
    return points, spans


# --- sending -------------------------------------------------------------------------------


class Sender:
    """POSTs OTLP/HTTP protobuf over one keep-alive connection per thread."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.local = threading.local()
        self.errors = 0
        self.lock = threading.Lock()

    def post(self, path: str, body: bytes) -> None:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", path, body, {"Content-Type": "application/x-protobuf"})
            resp = conn.getresponse()
            resp.read()
            ok = resp.status == 200
        except OSError:
            self.local.conn = None
            ok = False
        if not ok:
            with self.lock:
                self.errors += 1


def _ticks(first: float, every: float, until: float) -> list[float]:
    out = []
    while first <= until:
        out.append(first)
        first += every
    return out


def run_level(
    n: int, args: argparse.Namespace, stack: dict[str, Any], trace: Any, metrics: Any
) -> dict[str, Any]:
    job = f"loadgen-{uuid.uuid4().hex[:6]}-n{n}"
    start_ns = time.time_ns()
    ranks = [SimRank(trace, metrics, rank_resource(job, job, r, n), start_ns) for r in range(n)]
    sender = Sender(stack["ports"]["OTLP_HTTP"])
    window = min(1000 * args.step_seconds, 60.0)
    before = collector_counters(stack)
    cpu0 = {k: proc_cpu(pid) for k, pid in stack["pids"].items()}
    t0 = time.monotonic()
    lag_max = 0.0
    sent = {"metrics": 0, "trace": 0}
    # Ranks spread over the interval, as independent processes' timers would be.
    # With --per-request k, k ranks (a node behind its agent) share each request: the
    # OTLP messages are concatenated, which protobuf reads as one merged request.
    k = args.per_request
    groups = [ranks[i : i + k] for i in range(0, n, k)]
    offsets = [random.uniform(0, args.interval) for _ in groups]
    trace_offsets = [random.uniform(0, window) for _ in groups]
    events: list[tuple[float, int, str]] = [(0.0, g, "trace") for g in range(len(groups))]
    for g in range(len(groups)):
        events += [(t, g, "metrics") for t in _ticks(offsets[g], args.interval, args.hold)]
        events += [(t, g, "trace") for t in _ticks(trace_offsets[g] + window, window, args.hold)]
    events.sort()
    with cf.ThreadPoolExecutor(args.threads) as pool:
        pending: list[cf.Future[None]] = []
        for at, r, kind in events:
            delay = at - (time.monotonic() - t0)
            if delay > 0:
                time.sleep(delay)
            else:
                lag_max = max(lag_max, -delay)
            now = time.time_ns()
            if kind == "metrics":
                body = b"".join(rank.metrics_body(now) for rank in groups[r])
                path = "/v1/metrics"
            else:
                body = b"".join(rank.trace_body(now) for rank in groups[r])
                path = "/v1/traces"
            sent[kind] += len(groups[r])
            pending.append(pool.submit(sender.post, path, body))
            if len(pending) > 4 * args.threads:
                pending = [f for f in pending if not f.done()]
                if len(pending) > 4 * args.threads:
                    pending[0].result()
        cf.wait(pending)
    elapsed = time.monotonic() - t0
    time.sleep(3.0)  # the collector's batch timeout (1 s) and export
    after = collector_counters(stack)
    cpu = {k: (proc_cpu(pid) - cpu0[k]) / elapsed for k, pid in stack["pids"].items()}
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    try:
        series = {} if args.collector_only else prometheus_series(stack, job, n)
    except OSError as err:  # an overloaded Prometheus times out: that is a finding too
        series = {"error": f"Prometheus query failed: {err}"}
    points, spans = count_payload(metrics, trace)
    return {
        "ranks": n,
        "interval_s": args.interval,
        "ranks_per_request": k,
        "requests": len(events),
        "seconds": round(elapsed, 1),
        "metric_exports": sent["metrics"],
        "traces": sent["trace"],
        "points_per_s_offered": round(sent["metrics"] * points / elapsed, 1),
        "spans_per_s_offered": round(sent["trace"] * spans / elapsed, 1),
        "http_errors": sender.errors,
        "schedule_lag_max_s": round(lag_max, 2),
        "collector": {k: v for k, v in delta.items() if v},
        "queue_size_max": after.get("queue_size", 0.0),
        "cpu_cores": {k: round(v, 3) for k, v in cpu.items()},
        "series": series,
    }


# --- measuring -----------------------------------------------------------------------------


def collector_counters(stack: dict[str, Any]) -> dict[str, float]:
    """Sums of the Collector's own counters we care about (its /metrics)."""
    url = f"http://127.0.0.1:{stack['ports']['COLLECTOR_METRICS']}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            exporter = s.labels.get("exporter", "")
            if exporter.startswith("debug"):
                continue
            key = None
            if name.startswith("otelcol_receiver_") and name.endswith("_total"):
                key = name.removeprefix("otelcol_").removesuffix("_total")
            elif name.startswith("otelcol_exporter_") and name.endswith("_total"):
                key = f"{name.removeprefix('otelcol_').removesuffix('_total')}[{exporter}]"
            elif name == "otelcol_exporter_queue_size":
                out["queue_size"] = max(out.get("queue_size", 0.0), s.value)
            elif name.startswith("otelcol_processor_") and "refused" in name:
                key = name.removeprefix("otelcol_").removesuffix("_total")
            if key:
                out[key] = out.get(key, 0.0) + s.value
    return out


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prometheus_series(stack: dict[str, Any], job: str, n: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{stack['ports']['PROMETHEUS']}/api/v1/query?"

    def query(q: str) -> list[Any]:
        url = base + urllib.parse.urlencode({"query": q})
        body = json.loads(urllib.request.urlopen(url, timeout=60).read())
        return body["data"]["result"]  # type: ignore[no-any-return]

    raw = f'job="{job}", otel_train_rank!="", __name__!~".*:.*"'
    per_rank = query(f"count by (otel_train_rank) ({{{raw}}})")
    rules = query(f'count({{job="{job}", otel_train_rank!="", __name__=~".*:.*"}})')
    counts = sorted(int(r["value"][1]) for r in per_rank)
    total = query(f'count({{job="{job}"}})')
    names = query(f'count by (__name__) ({{job="{job}", otel_train_rank=""}})')
    return {
        "ranks_seen": len(counts),
        "per_rank_min": counts[0] if counts else 0,
        "per_rank_max": counts[-1] if counts else 0,
        "recorded_by_rules_per_rank": int(rules[0]["value"][1]) / max(1, n) if rules else 0,
        "total": int(total[0]["value"][1]) if total else 0,
        "without_rank_label": {r["metric"]["__name__"]: int(r["value"][1]) for r in names},
    }


# --- stack -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def collector_only_config(run_dir: Path) -> Path:
    """deploy/otel-collector.yaml with the metrics pipeline ending in the debug exporter
    only: the Collector's own ceiling, without Prometheus's ingest behind it."""
    import yaml

    config = yaml.safe_load((ROOT / "deploy" / "otel-collector.yaml").read_text())
    config["service"]["pipelines"]["metrics"]["exporters"] = ["debug"]
    path = run_dir / "otel-collector-only.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_stack(run_dir: Path, collector_only: bool) -> dict[str, Any]:
    env = dict(os.environ, OTEL_TRAIN_STACK_RUN=str(run_dir), OTEL_TRAIN_STACK_HOST="127.0.0.1")
    if collector_only:
        env["OTEL_TRAIN_STACK_COLLECTOR_CONFIG"] = str(collector_only_config(run_dir))
    loader = importlib.machinery.SourceFileLoader("otel_train_stack_loadgen", STACK[1])
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    names = list(module.PORTS)
    ports = {name: free_port() for name in names}
    env.update({f"OTEL_TRAIN_STACK_{k}_PORT": str(v) for k, v in ports.items()})
    up = subprocess.run([*STACK, "up"], env=env, capture_output=True, text=True, timeout=300)
    if up.returncode != 0:
        raise SystemExit(f"scripts/stack up failed:\n{up.stdout}{up.stderr}")
    state = json.loads((run_dir / "state.json").read_text())
    pids = {name: svc["pid"] for name, svc in state["services"].items()}
    return {"env": env, "ports": ports, "pids": pids}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="250,500,1000", help="comma-separated rank counts")
    ap.add_argument("--hold", type=float, default=30.0, help="seconds of load per rank count")
    ap.add_argument("--interval", type=float, default=10.0, help="metric export interval, s")
    ap.add_argument("--step-seconds", type=float, default=1.0, help="simulated step time, s")
    ap.add_argument("--threads", type=int, default=8, help="sender threads")
    ap.add_argument(
        "--per-request", type=int, default=1, help="ranks per OTLP request (8: a node's agent)"
    )
    ap.add_argument(
        "--collector-only",
        action="store_true",
        help="metrics end in the Collector's debug exporter (no Prometheus ingest)",
    )
    ap.add_argument("--max-seconds", type=float, default=900.0, help="hard cap on the run")
    args = ap.parse_args()
    levels = [int(x) for x in args.ranks.split(",")]
    if max(levels) > MAX_RANKS or min(levels) < 1:
        raise SystemExit(f"--ranks must be between 1 and {MAX_RANKS}")
    if (args.hold + 15) * len(levels) > args.max_seconds:
        raise SystemExit("--hold x levels exceeds --max-seconds")
    trace, metrics = capture_shapes()
    points, spans = count_payload(metrics, trace)
    print(f"payload per rank: {points} metric points per export, {spans} spans per step trace")
    names = sorted(
        {m.name for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    )
    print(f"metrics: {', '.join(names)}")
    with tempfile.TemporaryDirectory(prefix="otel-train-loadgen-") as tmp:
        stack = start_stack(Path(tmp), args.collector_only)
        try:
            for n in levels:
                print(json.dumps(run_level(n, args, stack, trace, metrics)), flush=True)
        finally:
            subprocess.run([*STACK, "down"], env=stack["env"], capture_output=True, timeout=120)


if __name__ == "__main__":
    main()
