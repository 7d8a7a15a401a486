"""One trace across processes (issue 15) against the real stack: a trainer and a
generator in two ``multiprocessing`` spawn processes, work passed through a queue, each
with its own otel-train session (its sidecar, its resource: service and role), both
exporting OTLP/HTTP to the Collector started from deploy/ on free loopback ports.

The trainer opens a step, puts ``otel_train.carrier(policy_version=k)`` on the queue
with the work, and waits for the rollout; the generator runs
``otel_train.phase("rollout", parent=carrier)``. Then Jaeger holds, for every sampled
carrier, one trace with the trainer's step span (the id the carrier named) and the
generator's rollout under it, each span with its own process's resource; no generator
span under an unsampled carrier; and Prometheus counts every rollout in the generator's
phase metrics, labelled with its role.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from typing import Any

import pytest
from stack_helpers import attrs, jaeger_chunks, poll, prom, running_stack

from otel_train import contract as c

pytestmark = pytest.mark.stack
STEPS = 12

RUN = textwrap.dedent("""
    import json, multiprocessing as mp, sys, time
    import otel_train

    def generator(work, done, service):
        otel_train.configure(service_name=service, role="generator", console="off",
                             prometheus=False, metric_export_interval=0.5)
        while (item := work.get()) is not None:
            carrier, k = item
            with otel_train.phase("rollout", parent=carrier):
                with otel_train.phase("generate"):
                    time.sleep(0.05)
            done.put(k)
        assert otel_train.shutdown(), "the generator's shutdown missed its deadline"

    if __name__ == "__main__":
        trainer, gen, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
        ctx = mp.get_context("spawn")
        work, done = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=generator, args=(work, done, gen))
        proc.start()
        # Carriers are sampled once per window: about every third step here.
        otel_train.configure(service_name=trainer, role="trainer", console="off",
                             prometheus=False, metric_export_interval=0.5,
                             trace_window_seconds=0.3)
        carriers = []
        for k in range(steps):
            with otel_train.step(samples=8):
                carrier = otel_train.carrier(policy_version=k)
                carriers.append(carrier)
                work.put((carrier, k))
                with otel_train.phase("wait_rollout"):
                    assert done.get(timeout=60) == k
                with otel_train.phase("train"):
                    time.sleep(0.02)
        work.put(None)
        proc.join(60)
        assert proc.exitcode == 0, proc.exitcode
        assert otel_train.shutdown(), "the trainer's shutdown missed its deadline"
        print(json.dumps(carriers))
""")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("carrier")
    script = tmp / "rl.py"
    script.write_text(RUN)
    tag = uuid.uuid4().hex[:8]
    names = {"trainer": f"trainer-{tag}", "generator": f"generator-{tag}"}
    with running_stack(tmp_path_factory.mktemp("carrier-stack")) as stack:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}"
        env["OMP_NUM_THREADS"] = "1"
        start = time.time()
        cmd = [sys.executable, str(script), names["trainer"], names["generator"], str(STEPS)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        carriers = json.loads(done.stdout.strip().splitlines()[-1])
        yield {"stack": stack, "start": start, "names": names, "carriers": carriers}


def _ids(carrier: dict[str, str]) -> tuple[str, str, bool]:
    _, trace_id, span_id, flags = carrier["traceparent"].split("-")
    return trace_id, span_id, flags == "01"


def _trace(stack: Any, trace_id: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(resource attributes, span) of every span of one trace, from Jaeger's /api/v3."""
    url = f"http://127.0.0.1:{stack['ports']['JAEGER_UI']}/api/v3/traces/{trace_id}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    return [
        (attrs(rs.get("resource", {})), span)
        for rs in body.get("result", {}).get("resourceSpans", [])
        for ss in rs.get("scopeSpans", [])
        for span in ss.get("spans", [])
    ]


def test_each_sampled_step_is_one_trace_with_the_generators_rollout_under_it(
    run: dict[str, Any],
) -> None:
    stack, names = run["stack"], run["names"]
    sampled = [c_ for c_ in run["carriers"] if _ids(c_)[2]]
    assert 2 <= len(sampled) < STEPS  # the first, then about one per 0.3 s window
    for carrier in sampled:
        trace_id, span_id, _ = _ids(carrier)

        def whole(trace_id: str = trace_id) -> Any:
            spans = _trace(stack, trace_id)
            names_in = {s["name"] for _, s in spans}
            return spans if {"otel_train.step", "rollout", "generate"} <= names_in else None

        spans = poll(whole, f"trace {trace_id} with both processes' spans")
        by_name = {s["name"]: (res, s) for res, s in spans}
        step_res, step = by_name[c.STEP_SPAN.name]
        assert step["spanId"] == span_id and not step.get("parentSpanId")
        assert step_res["service.name"] == names["trainer"]
        assert step_res[c.RESOURCE_ROLE.key] == "trainer"
        rollout_res, rollout = by_name["rollout"]
        assert rollout["parentSpanId"] == span_id  # under the trainer's step
        assert rollout_res["service.name"] == names["generator"]
        assert rollout_res[c.RESOURCE_ROLE.key] == "generator"
        assert rollout_res["service.instance.id"] != step_res["service.instance.id"]
        index = int(carrier["baggage"].split(",")[0].split("=")[1])
        assert int(attrs(rollout)[c.STEP_INDEX.key]) == index
        assert int(attrs(rollout)[c.POLICY_VERSION.key]) == index
        assert by_name["generate"][1]["parentSpanId"] == rollout["spanId"]
        assert by_name["wait_rollout"][1]["parentSpanId"] == span_id


def test_rollouts_under_unsampled_carriers_feed_metrics_only(run: dict[str, Any]) -> None:
    stack, names = run["stack"], run["names"]
    sampled = {_ids(c_)[0] for c_ in run["carriers"] if _ids(c_)[2]}
    count = c.prometheus_base_name(c.PHASE_DURATION) + "_count"
    sel = f'{{job="{names["generator"]}", phase="rollout", otel_train_role="generator"}}'

    def every_rollout() -> Any:
        got = prom(stack, "/api/v1/query", query=f"max_over_time({count}{sel}[10m])")["result"]
        return got if got and float(got[0]["value"][1]) == STEPS else None

    poll(every_rollout, f"{STEPS} rollouts in the generator's phase metrics")
    # (a query by service gives whole traces: the trainer's spans in them too)
    spans = [
        span
        for rs in jaeger_chunks(stack, names["generator"], run["start"])
        if attrs(rs.get("resource", {}))["service.name"] == names["generator"]
        for ss in rs.get("scopeSpans", [])
        for span in ss.get("spans", [])
    ]
    rollouts = {s["traceId"] for s in spans if s["name"] == "rollout"}
    assert rollouts == sampled  # a span under each sampled carrier, none under the others
    assert {s["name"] for s in spans} == {"rollout", "generate"}  # it opened no step
