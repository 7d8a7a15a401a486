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

import importlib.util
import json
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from typing import Any

import pytest
from scratch import job_env
from stack_helpers import (
    ROOT,
    attrs,
    dashboard_queries,
    jaeger_chunks,
    poll,
    prom,
    query_data,
    running_stack,
)

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
            kind, carrier, k = item
            if kind == "sync":  # the generator's side of the weight sync
                with otel_train.phase("weight_sync", parent=carrier):
                    time.sleep(0.01)
                done.put(("synced", k, None))
                continue
            with otel_train.phase("rollout", parent=carrier) as rollout:
                with otel_train.phase("generate"):
                    time.sleep(0.05)
            done.put(("rollout", k, rollout.produced()))
        assert otel_train.shutdown(), "the generator's shutdown missed its deadline"

    if __name__ == "__main__":
        trainer, gen, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
        ctx = mp.get_context("spawn")
        work, done = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=generator, args=(work, done, gen))
        proc.start()
        # Carriers are sampled once per window: about every third step here.
        otel_train.configure(service_name=trainer, role="trainer", console="stderr",
                             console_every=STEPS, prometheus=False,
                             metric_export_interval=0.5, trace_window_seconds=0.3)
        carriers, tokens, previous = [], [], None
        for k in range(steps):
            with otel_train.step(samples=8):
                carrier = otel_train.carrier(policy_version=k)
                carriers.append(carrier)
                work.put(("rollout", carrier, k))
                with otel_train.phase("wait_rollout"):
                    kind, got, token = done.get(timeout=60)
                    assert (kind, got) == ("rollout", k)
                tokens.append(token)
                if previous is not None:  # off-policy: last step's rollout, one version old
                    otel_train.consumed(previous, policy_version=k)
                previous = token
                with otel_train.phase("train"):
                    time.sleep(0.02)
                with otel_train.phase("weight_sync"):  # timed here and in the generator
                    work.put(("sync", carrier, k))
                    assert done.get(timeout=60)[:2] == ("synced", k)
        work.put(None)
        proc.join(60)
        assert proc.exitcode == 0, proc.exitcode
        assert otel_train.shutdown(), "the trainer's shutdown missed its deadline"
        print(json.dumps({"carriers": carriers, "tokens": tokens}))
""").replace("STEPS", str(STEPS))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("carrier")
    script = tmp / "rl.py"
    script.write_text(RUN)
    tag = uuid.uuid4().hex[:8]
    names = {"trainer": f"trainer-{tag}", "generator": f"generator-{tag}"}
    with running_stack(tmp_path_factory.mktemp("carrier-stack")) as stack:
        env = job_env()
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}"
        env["OMP_NUM_THREADS"] = "1"
        start = time.time()
        cmd = [sys.executable, str(script), names["trainer"], names["generator"], str(STEPS)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        out = json.loads(done.stdout.strip().splitlines()[-1])
        yield {"stack": stack, "start": start, "names": names, "stderr": done.stderr, **out}


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
    base = c.prometheus_base_name(c.PHASE_DURATION)  # (a native histogram: one series)
    sel = f'{{job="{names["generator"]}", phase="rollout", otel_train_role="generator"}}'

    def every_rollout() -> Any:
        q = f"histogram_count(last_over_time({base}{sel}[10m]))"
        got = prom(stack, "/api/v1/query", query=q)["result"]
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
    assert {s["name"] for s in spans} == {"rollout", "generate", "weight_sync"}  # no step


def _sampled_trace(stack: Any, carrier: dict[str, str], names: set[str]) -> Any:
    """The trace a sampled carrier names, once it holds spans of every name in ``names``."""
    trace_id = _ids(carrier)[0]

    def whole() -> Any:
        spans = _trace(stack, trace_id)
        return spans if names <= {s["name"] for _, s in spans} else None

    return poll(whole, f"trace {trace_id} with {sorted(names)}")


def test_weight_sync_is_timed_on_both_sides_under_one_carrier(run: dict[str, Any]) -> None:
    stack, names = run["stack"], run["names"]
    for carrier in [c_ for c_ in run["carriers"] if _ids(c_)[2]]:
        trace_id, span_id, _ = _ids(carrier)

        def syncs(trace_id: str = trace_id) -> Any:
            found = [(r, s) for r, s in _trace(stack, trace_id) if s["name"] == "weight_sync"]
            return found if len(found) == 2 else None

        found = poll(syncs, "both weight_sync spans")
        sides = {r["service.name"]: s for r, s in found}
        assert set(sides) == {names["trainer"], names["generator"]}
        assert all(s["parentSpanId"] == span_id for s in sides.values())  # the one step
    base = c.prometheus_base_name(c.PHASE_DURATION)  # (a native histogram: one series)
    for job in names.values():
        sel = f'{{job="{job}", phase="weight_sync"}}'

        def every_sync(sel: str = sel) -> Any:
            q = f"histogram_count(last_over_time({base}{sel}[10m]))"
            got = prom(stack, "/api/v1/query", query=q)
            result = got["result"]
            return result if result and float(result[0]["value"][1]) == STEPS else None

        poll(every_sync, f"{STEPS} weight syncs in {job}'s phase metrics")


def test_an_off_policy_step_links_to_the_rollout_it_consumed(run: dict[str, Any]) -> None:
    stack, names = run["stack"], run["names"]
    carriers, tokens = run["carriers"], run["tokens"]
    checked = 0
    for k, carrier in enumerate(carriers[:-1]):
        if not _ids(carrier)[2]:
            continue
        # Step k + 1 consumed rollout k: its span links to the rollout's, whose id the
        # generator's token named when the rollout ended. (Step k + 1 is traced for it.)
        rollout_trace, rollout_span, _ = _ids(tokens[k])
        assert rollout_trace == _ids(carrier)[0]
        spans = _sampled_trace(stack, carrier, {"rollout"})
        (rollout,) = [s for _, s in spans if s["name"] == "rollout"]
        assert rollout["spanId"] == rollout_span
        consumer = carriers[k + 1]
        step = poll(
            lambda consumer=consumer: next(
                (s for _, s in _trace(stack, _ids(consumer)[0]) if s["name"] == c.STEP_SPAN.name),
                None,
            ),
            f"step {k + 1}'s span",
        )
        assert step["spanId"] == _ids(consumer)[1]
        (link,) = step["links"]
        assert (link["traceId"], link["spanId"]) == (rollout_trace, rollout_span)
        assert int(attrs(link)[c.LINK_STALENESS.key]) == 1
        assert int(attrs(link)[c.POLICY_VERSION.key]) == k
        checked += 1
    assert checked >= 1
    name = c.prometheus_base_name(c.POLICY_STALENESS)
    sel = f'{{job="{names["trainer"]}"}}'

    def staleness() -> Any:
        got = {}
        for part in ("count", "sum"):
            q = f"histogram_{part}(last_over_time({name}{sel}[10m]))"
            result = prom(stack, "/api/v1/query", query=q)["result"]
            got[part] = float(result[0]["value"][1]) if result else None
        return got if got == {"count": STEPS - 1, "sum": STEPS - 1} else None

    poll(staleness, "every consumed rollout's staleness (1) in the trainer's histogram")


def test_the_trainers_summary_shows_the_generators_rollouts(run: dict[str, Any]) -> None:
    summary = run["stderr"].split("run summary:")[1]
    rows = [line.split() for line in summary.splitlines()]
    (row,) = [r for r in rows if r[:2] == ["rollout", "[generator]"]]
    assert row[4:6] == ["-", str(STEPS - 1)]  # no share of the trainer's wall; calls
    assert float(row[2]) >= (STEPS - 1) * 0.05 * (1e3 if row[3] == "ms" else 1)


def _cross_process_queries() -> list[tuple[str, str]]:
    spec = importlib.util.spec_from_file_location("grafana_build", ROOT / "grafana" / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    panels = build.CROSS_PROCESS_PANELS
    got = [(p, e) for p, e in dashboard_queries("rl-loop") if p.split(" [")[0] in panels]
    assert {p.split(" [")[0] for p, _ in got} == set(panels)
    return got


@pytest.mark.parametrize(("panel", "expr"), _cross_process_queries())
def test_the_rl_dashboards_cross_process_panels_have_data(
    run: dict[str, Any], panel: str, expr: str
) -> None:
    """The RL dashboard's generator-against-trainer and staleness panels, as Grafana
    would query them with $job the trainer (test_stack_e2e.py: the RL example's)."""
    stack, job = run["stack"], run["names"]["trainer"]
    found = poll(lambda: query_data(stack, expr, job, run["start"]), f"data for {panel}")
    if "generator" in expr:  # the generator's rollouts and weight syncs, by phase
        legends = {r["metric"].get("phase") for r in found}
        assert legends in ({None}, {"rollout", "weight_sync"}), legends
