"""An application that set up OpenTelemetry itself, against the real stack on loopback.

The job builds its own SDK providers as such an application does (a ``BatchSpanProcessor``
and a ``PeriodicExportingMetricReader``, both OTLP/HTTP to the Collector started from
deploy/), opens a span of its own, and passes the providers to ``instrument()``. The
sidecar does otel-train's work and the relay hands the results to those providers in
the training process, a span at a time (otel_train/handover/relay_in.py). Then Jaeger
holds every step's trace under the application's service, with its four phases, beside
the application's own span; Prometheus holds the step count, the per-phase duration
histograms and the samples counter as the run's own figures give them, and no span was
dropped on the way.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any

import pytest
from scratch import job_env
from stack_helpers import TINY_JOB, attrs, jaeger_traces, poll, prom, running_stack

from otel_train import contract as c

pytestmark = pytest.mark.stack
STEPS = 40
BATCH = 16

JOB = (
    textwrap.dedent("""
    import sys, torch, otel_train
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()  # (its service.name from OTEL_SERVICE_NAME)
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(), export_interval_millis=500)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])

""")
    + TINY_JOB
    + textwrap.dedent("""
    otel_train.instrument(model, optimizer=opt, dataloader=loader, trace_steps="all",
                          console="off", tracer_provider=tracer_provider,
                          meter_provider=meter_provider)
    session = otel_train.session.current()
    assert session.feeder is not None and session.feeder.relay is not None
    relay = session.feeder.relay
    steps = int(sys.argv[1])
    with tracer_provider.get_tracer("app").start_as_current_span("app.training"):
        done = 0
        while done < steps:
            for batch in loader:
                loss = torch.nn.functional.cross_entropy(model(batch["input_ids"]),
                                                         batch["labels"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                done += 1
                if done == steps:
                    break
    otel_train.shutdown()
    print("relay dropped", relay.dropped)
    meter_provider.shutdown()
    tracer_provider.shutdown()
""")
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_stack(tmp_path_factory.mktemp("stack-run")) as stack:
        tmp = tmp_path_factory.mktemp("job")
        (tmp / "app.py").write_text(JOB)
        service = f"e2e-app-{uuid.uuid4().hex[:8]}"
        env = job_env()
        env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}",
                    "OTEL_SERVICE_NAME": service})  # fmt: skip
        start = time.time()
        done = subprocess.run([sys.executable, str(tmp / "app.py"), str(STEPS)], env=env,
                              cwd=tmp, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "relay dropped 0" in done.stdout, done.stdout + done.stderr
        yield {"stack": stack, "service": service, "start": start}


def test_jaeger_holds_every_step_beside_the_applications_own_span(run: Any) -> None:
    stack, service = run["stack"], run["service"]

    def seen() -> list[dict[str, Any]]:
        spans = jaeger_traces(stack, service, run["start"])
        roots = [s for s in spans if s["name"] == c.STEP_SPAN.name]
        mine = [s for s in spans if s["name"] == "app.training"]
        return spans if len(roots) >= STEPS and mine else []

    spans = poll(seen, f"{STEPS} step traces and the application's span in Jaeger")
    roots = [s for s in spans if s["name"] == c.STEP_SPAN.name]
    assert sorted(int(attrs(r)[c.STEP_INDEX.key]) for r in roots) == list(range(STEPS))
    by_parent: dict[str, set[str]] = {}
    for s in spans:
        by_parent.setdefault(s.get("parentSpanId", ""), set()).add(s["name"])
    for root in roots:
        assert by_parent[root["spanId"]] == {"data", "forward", "backward", "optimizer"}
        assert int(attrs(root)[c.STEP_SAMPLES.key]) == BATCH


def test_prometheus_holds_the_runs_figures_from_the_applications_reader(run: Any) -> None:
    stack, sel = run["stack"], f'{{job="{run["service"]}"}}'

    def latest(name: str) -> dict[str, float]:
        got = prom(stack, "/api/v1/query", query=f"max_over_time({name}{sel}[10m])")["result"]
        return {r["metric"].get(c.A_PHASE, ""): float(r["value"][1]) for r in got}

    steps = c.prometheus_base_name(c.STEPS)
    poll(lambda: latest(steps) == {"": float(STEPS)}, f"{steps} at {STEPS}")
    # (explicit buckets, as the application's reader asks: stored as a native histogram
    # with custom buckets)
    phases = c.prometheus_base_name(c.PHASE_DURATION)
    got = prom(stack, "/api/v1/query", query=f"histogram_count(last_over_time({phases}{sel}[10m]))")
    per_phase = {r["metric"][c.A_PHASE]: float(r["value"][1]) for r in got["result"]}
    assert per_phase == {p: float(STEPS) for p in ("data", "forward", "backward", "optimizer")}
    assert latest(c.prometheus_base_name(c.SAMPLES)) == {"": float(STEPS * BATCH)}
    dropped = c.prometheus_base_name(c.DROPPED)
    query = f'max_over_time({dropped}{{job="{run["service"]}",reason="span_queue"}}[10m])'
    assert [float(r["value"][1]) for r in prom(stack, "/api/v1/query", query=query)["result"]] in (
        [],
        [0.0],
    )
