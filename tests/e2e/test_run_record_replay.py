"""A run record replayed into the real stack: a job trains with the embedded default (no
endpoint, nothing but its run record to show), then ``otel-train replay`` sends the
record to the Collector over OTLP/HTTP as it was written. Jaeger then holds the job's
step traces with the recorded span ids, Prometheus its step counter with the recorded
value, and every query of the training overview returns data for it. The same record
with every timestamp moved a day back (a run recorded yesterday) lands too: its metrics
as well as its traces, though Prometheus holds newer samples than them.

(The Collector's own ``otlpjsonfile`` receiver reads the same files, but the module is
not served by this machine's Go module proxy; its OTLP/HTTP receiver parses the same
OTLP/JSON, so this replay checks the format with the real Collector too.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from scratch import job_env
from stack_helpers import (
    SINGLE_PROCESS_EMPTY,
    TINY_JOB,
    dashboard_queries,
    jaeger_traces,
    poll,
    prom,
    query_data,
    running_stack,
)

from otel_train import contract as c

pytestmark = pytest.mark.stack

JOB = (
    textwrap.dedent("""
    import sys, time, torch, otel_train
""")
    + TINY_JOB
    + textwrap.dedent("""
    otel_train.instrument(model, optimizer=opt, dataloader=loader, peak_tflops=0.5,
                          run_dir=sys.argv[1], prometheus=False)
    for _ in range(int(sys.argv[2])):
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["input_ids"]), batch["labels"])
            opt.zero_grad(); loss.backward()
            time.sleep(0.02)  # inside the step: the straggler rules score steps over 1 ms
            opt.step()
            otel_train.record(loss=loss.detach())
    assert otel_train.shutdown()
""")
)


def _recorded_trace_ids(run: Path) -> set[str]:
    ids = set()
    for line in (run / "rank0.traces.jsonl").read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                ids.update(s["traceId"] for s in ss["spans"] if s["name"] == c.STEP_SPAN.name)
    return ids


DAY_NS = 86_400 * 10**9


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A job's run record (8 epochs of 16 steps), and the stack to replay it into."""
    tmp = tmp_path_factory.mktemp("replay")
    service = f"record-{uuid.uuid4().hex[:8]}"
    env = job_env()
    env["OTEL_SERVICE_NAME"] = service
    env["OTEL_TRAIN_CONSOLE"] = "off"
    env["OTEL_METRIC_EXPORT_INTERVAL"] = "1000"  # a snapshot a second in the record
    runs = tmp / "runs"
    job = subprocess.run([sys.executable, "-c", JOB, str(runs), "8"], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    (run,) = runs.iterdir()
    assert run.name.startswith(f"{service}-")
    with running_stack(tmp / "stack") as stack:
        yield {"run": run, "service": service, "env": env, "stack": stack, "tmp": tmp}


def _replay(recorded: dict[str, Any], run: Path) -> None:
    endpoint = f"http://127.0.0.1:{recorded['stack']['ports']['OTLP_HTTP']}"
    replay = subprocess.run(
        [sys.executable, "-m", "otel_train.cli", "replay", str(run), "--endpoint", endpoint],
        env=recorded["env"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    assert "requests from 2 files" in replay.stdout


def test_a_run_record_replays_into_jaeger_and_prometheus(recorded: dict[str, Any]) -> None:
    run, service, stack = recorded["run"], recorded["service"], recorded["stack"]
    recorded_ids = _recorded_trace_ids(run)
    assert recorded_ids  # the sampled steps' traces
    start = time.time() - 600
    _replay(recorded, run)

    def traces() -> Any:
        spans = jaeger_traces(stack, service, start)
        found = {s["traceId"] for s in spans if s["name"] == c.STEP_SPAN.name}
        return found if found >= recorded_ids else None

    assert poll(traces, "the replayed step traces in Jaeger", timeout=60) == recorded_ids
    steps = c.prometheus_names(c.STEPS)[0]

    def counted() -> Any:
        result = prom(stack, "/api/v1/query", query=f'{steps}{{job="{service}"}}')["result"]
        return result if result and float(result[0]["value"][1]) == 8 * 16 else None

    poll(counted, "the replayed step counter in Prometheus", timeout=60)
    for title, expr in dashboard_queries("training-overview"):  # (rules: next evaluation)
        if title.split(" [")[0] in SINGLE_PROCESS_EMPTY:
            continue
        poll(lambda e=expr: query_data(stack, e, service, start), title, timeout=60)


def _a_day_back(node: Any, service: str) -> Any:
    """An OTLP/JSON request with every time (``timeUnixNano``, ``startTimeUnixNano``...)
    a day earlier and the resource's service.name replaced (a run of its own)."""
    if isinstance(node, list):
        return [_a_day_back(x, service) for x in node]
    if not isinstance(node, dict):
        return node
    if node.get("key") == "service.name" and "value" in node:
        return {"key": "service.name", "value": {"stringValue": service}}
    return {
        k: str(int(v) - DAY_NS) if k.lower().endswith("timeunixnano") else _a_day_back(v, service)
        for k, v in node.items()
    }


def test_a_run_recorded_a_day_ago_lands_its_metrics_too(recorded: dict[str, Any]) -> None:
    """Prometheus already holds samples of today (its own scrape's ``up``, the rules'
    series): a day-old record's points are out of order by a day, and land only if the
    stack's out-of-order window reaches back that far (7 d in deploy/)."""
    run, stack = recorded["run"], recorded["stack"]
    service = f"{recorded['service']}-yesterday"
    old = recorded["tmp"] / "yesterday" / run.name
    old.mkdir(parents=True)
    for path in sorted(run.glob("*.jsonl")):
        lines = [_a_day_back(json.loads(line), service) for line in path.read_text().splitlines()]
        (old / path.name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    text = (old / "rank0.metrics.jsonl").read_text()
    times = [int(t) / 1e9 for t in re.findall(r'"timeUnixNano": "(\d+)"', text)]
    start, end = min(times), max(times)
    assert time.time() - 86_400 - 600 < start < end < time.time() - 86_400
    _replay(recorded, old)
    ids = _recorded_trace_ids(run)  # (the spans keep their ids)

    def traces() -> Any:
        return ids <= {s["traceId"] for s in jaeger_traces(stack, service, start - 60)}

    poll(traces, "yesterday's step traces in Jaeger")
    steps = c.prometheus_names(c.STEPS)[0]

    def counted() -> Any:
        q = {"query": f'{steps}{{job="{service}"}}', "time": str(end + 1)}
        result = prom(stack, "/api/v1/query", **q)["result"]
        return result if result and float(result[0]["value"][1]) == 8 * 16 else None

    poll(counted, "yesterday's step counter in Prometheus, as it stood at the run's end")
    for title, expr in dashboard_queries("training-overview"):
        if ":" in expr or title.split(" [")[0] in SINGLE_PROCESS_EMPTY:
            continue  # a rule's series (job_rank:...): the rules evaluate today only
        found = poll(lambda e=expr: query_data(stack, e, service, start, end + 60), title)
        assert found, title
