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
generator's HTTP errors and whether it kept the schedule; CPU and memory (RSS) of every
server (Collector, Prometheus, Jaeger, Thanos receive and query); Prometheus's and Thanos
receive's head series, Go heap and samples appended per second; and from Prometheus the
series per rank. The duration histograms go as otel-train sends them over OTLP
(exponential, stored as native histograms); ``--classic`` sends explicit buckets and
stores them as classic histograms, the form before. ``--gpu`` sends a GPU-shaped rank:
the loop trains on token ids with a known peak (a tokens counter, MFU), and the CUDA
memory series it cannot measure here (each phase's allocated and reserved peak, the
device's limit) are added in the contract's form. Bounded: at most 20000 ranks and
``--max-seconds`` in all; loopback only.

``--stall``: one rank's training thread stops ``--stall-at`` s into each level (its progress
age rises, the others' stay low; ``--peers-wait``: they then wait in an all-reduce), and the
level reports how long after ``--hang-after`` OtelTrainRankStalled (OtelTrainRankHoldsJob)
named it and what the rule groups cost to evaluate (benchmarks/stall.py).

Usage: python benchmarks/loadgen.py [--ranks 250,500,1000] [--hold 30] [--interval 10]
                                   [--per-request 1] [--step-seconds 1] [--classic] [--gpu]
                                   [--stall [--stall-at 10] [--hang-after 30] [--peers-wait]]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import copy
import http.client
import json
import random
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from loadgen_stack import STACK, start_stack
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import encode_spans
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric, NumberDataPoint
from stack_probe import collector_counters, proc_cpu, prometheus_series, server_stats
from stall import AlertWatch, Stall, progress_points, progress_shape

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

MAX_RANKS = 20_000
RANKS_PER_NODE = 8


# --- real shapes ---------------------------------------------------------------------------


def capture_shapes(classic: bool, gpu: bool = False) -> tuple[Any, Any]:
    """(one step trace, one metric collection) of a real instrumented loop, as OTLP protobuf:
    the duration histograms as otel-train's OTLP reader sends them (exponential buckets), or
    with ``classic`` explicit buckets. ``gpu``: a GPU-shaped rank (see gpu_shape)."""
    tel = InMemoryTelemetry(otlp_histograms=not classic)
    if gpu:  # token-id batches (a tokens counter) and a known peak (MFU)
        model: torch.nn.Module = torch.nn.Sequential(
            torch.nn.Embedding(100, 8), torch.nn.Flatten(), torch.nn.Linear(8 * 16, 4)
        )
        data = [(torch.randint(0, 100, (16, 16)), torch.randint(0, 4, (16,))) for _ in range(8)]
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
        )
        data = [(torch.randn(16, 32), torch.randint(0, 4, (16,))) for _ in range(8)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    otel_train.instrument(
        model,
        optimizer=opt,
        dataloader=loader,
        tracer_provider=tel.tracer_provider,
        meter_provider=tel.meter_provider,
        trace_steps="all",
        console="off",
        **({"peak_tflops": 989.0} if gpu else {}),
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
    if gpu:
        gpu_shape(metrics)
    return trace, metrics


def gpu_shape(metrics: Any) -> None:
    """Add what only CUDA gives a rank, in the contract's form: each phase's allocated and
    reserved peak, and the device's memory limit (this machine has no GPU; the values are
    an 80 GB device's). The tokens counter and MFU come from the real loop above."""
    (scope,) = [sm for rm in metrics.resource_metrics for sm in rm.scope_metrics]
    phases = sorted(
        next(a.value.string_value for a in p.attributes if a.key == c.A_PHASE)
        for m in scope.metrics
        if m.name == c.PHASE_DURATION.name
        for p in _points(m)
    )
    now = time.time_ns()

    def gauge(spec: c.MetricSpec, rows: list[tuple[dict[str, str], float]]) -> None:
        points = [
            NumberDataPoint(
                as_double=v, time_unix_nano=now, attributes=[kv(*a) for a in attrs.items()]
            )
            for attrs, v in rows
        ]
        scope.metrics.append(
            Metric(
                name=spec.name,
                unit=spec.unit,
                description=spec.description,
                gauge=Gauge(data_points=points),
            )
        )

    peaks = [({c.A_PHASE: p, c.A_KIND: k}, 4e10) for p in phases for k in ("allocated", "reserved")]
    gauge(c.PHASE_MEMORY_PEAK, peaks)
    gauge(c.DEVICE_MEMORY_LIMIT, [({c.A_HW_ID: "GPU-0"}, 8e10)])


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

    def __init__(
        self,
        trace: Any,
        metrics: Any,
        resource: list[KeyValue],
        start_ns: int,
        progress: Any = None,
    ):
        self.metrics = copy.deepcopy(metrics)
        self.trace = copy.deepcopy(trace)
        # progress: wall time -> (age, waiting) of a rank whose gauges move (stall.py)
        self.progress = progress
        self.points = progress_points(self.metrics) if progress else {}
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
        if self.progress is not None:
            age, waiting = self.progress(now_ns / 1e9)
            self.points[c.PROGRESS_AGE.name].as_double = age
            self.points[c.COLLECTIVE_WAITING.name].as_double = waiting
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
    stall = watch = None
    if args.stall:
        stall = Stall(n // 2, args.stall_at, args.hang_after, args.peers_wait, args.step_seconds)
        watch = AlertWatch(stack, job, stall)
    ranks = [
        SimRank(
            trace,
            metrics,
            rank_resource(job, job, r, n),
            start_ns,
            stall.reading(r) if stall else None,
        )
        for r in range(n)
    ]
    sender = Sender(stack["ports"]["OTLP_HTTP"])
    window = min(1000 * args.step_seconds, 60.0)
    before = collector_counters(stack)
    stats0 = server_stats(stack)
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
    if watch is not None and stall is not None:  # when the stalled rank exports (wall clock)
        wall0 = time.time() - (time.monotonic() - t0)
        watch.exports = [
            wall0 + at for at in _ticks(offsets[stall.rank // k], args.interval, args.hold)
        ]
        watch.start()
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
    stalled = watch.report() if watch is not None else None
    time.sleep(3.0)  # the collector's batch timeout (1 s) and export
    after = collector_counters(stack)
    cpu = {k: (proc_cpu(pid) - cpu0[k]) / elapsed for k, pid in stack["pids"].items()}
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    time.sleep(0 if args.collector_only else 5.0)  # Prometheus's remote write (5 s batches)
    stats = server_stats(stack)
    appended = {
        k.replace("samples_appended", "samples_per_s"): round((v - stats0.get(k, 0.0)) / elapsed)
        for k, v in stats.items()
        if k.startswith("samples_appended")
    }
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
        "memory": {k: round(v, 1) for k, v in stats.items() if "samples" not in k},
        "samples_per_s": appended,
        "series": series,
        **({"stall": stalled} if stalled is not None else {}),
    }


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
    ap.add_argument(
        "--classic",
        action="store_true",
        help="explicit-bucket histograms stored as classic ones (the form before native ones)",
    )
    ap.add_argument(
        "--gpu",
        action="store_true",
        help="a GPU-shaped rank: token batches, a known peak (MFU), and CUDA's memory series",
    )
    ap.add_argument(
        "--stall",
        action="store_true",
        help="one rank stalls (stall.py): how long until OtelTrainRankStalled names it",
    )
    ap.add_argument("--stall-at", type=float, default=10.0, help="seconds into each level")
    ap.add_argument("--hang-after", type=float, default=30.0, help="the ranks' limit, s")
    ap.add_argument(
        "--peers-wait", action="store_true", help="the other ranks then wait in an all-reduce"
    )
    ap.add_argument("--max-seconds", type=float, default=900.0, help="hard cap on the run")
    args = ap.parse_args()
    levels = [int(x) for x in args.ranks.split(",")]
    if max(levels) > MAX_RANKS or min(levels) < 1:
        raise SystemExit(f"--ranks must be between 1 and {MAX_RANKS}")
    if (args.hold + 15) * len(levels) > args.max_seconds:
        raise SystemExit("--hold x levels exceeds --max-seconds")
    if args.stall and args.hold < args.stall_at + args.hang_after + 20:
        raise SystemExit("--hold must cover --stall-at + --hang-after + 20 s")
    trace, metrics = capture_shapes(args.classic, args.gpu)
    if args.stall:
        progress_shape(metrics, args.hang_after)
    points, spans = count_payload(metrics, trace)
    print(f"payload per rank: {points} metric points per export, {spans} spans per step trace")
    names = sorted(
        {m.name for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    )
    print(f"metrics: {', '.join(names)}")
    with tempfile.TemporaryDirectory(prefix="otel-train-loadgen-") as tmp:
        stack = start_stack(Path(tmp), args.collector_only, args.classic)
        try:
            for n in levels:
                print(json.dumps(run_level(n, args, stack, trace, metrics)), flush=True)
        finally:
            subprocess.run([*STACK, "down"], env=stack["env"], capture_output=True, timeout=120)


if __name__ == "__main__":
    main()
