"""Helpers of the end-to-end tests: the real stack on free loopback ports, its query APIs,
and the dashboards' queries run against it as Grafana would run them."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.machinery
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
STACK = [sys.executable, str(ROOT / "scripts" / "stack")]
# The jobs' tiny model, optimizer and loader (16 rows of 8 token ids a batch), lines of a
# job's script after its imports (torch among them).
TINY_JOB = """torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.EmbeddingBag(100, 32), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
ids, labels = torch.randint(0, 100, (256, 8)), torch.randint(0, 4, (256,))
rows = [{"input_ids": ids[i], "labels": labels[i]} for i in range(256)]
loader = torch.utils.data.DataLoader(rows, batch_size=16)
"""
DASHBOARDS = ROOT / "grafana" / "dashboards"


def _stack_ports() -> list[str]:
    """The port names scripts/stack knows (it has no .py suffix: load it by path)."""
    loader = importlib.machinery.SourceFileLoader("otel_train_stack_e2e", STACK[1])
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return list(module.PORTS)


PORT_NAMES = _stack_ports()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def poll(fn: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as err:  # the service may still be ingesting
            last = err
        else:
            if last:
                return last
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@contextlib.contextmanager
def running_stack(run_dir: Path, **env_extra: str) -> Iterator[dict[str, Any]]:
    """``scripts/stack up`` on free loopback ports in ``run_dir`` (the job's /metrics port,
    TRAINING_METRICS, included); down (and every process gone) on exit. Skips, or fails
    under OTEL_TRAIN_STACK_REQUIRED=1, when not built."""
    if subprocess.run([*STACK, "built"], capture_output=True).returncode != 0:
        reason = "stack binaries not built: run scripts/stack build (scripts/test does)"
        if os.environ.get("OTEL_TRAIN_STACK_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    env = dict(os.environ)
    ports = {}
    for name in PORT_NAMES:
        port = free_port()
        while port in ports.values():  # (the OS may hand a released port out again)
            port = free_port()
        ports[name] = port
        env[f"OTEL_TRAIN_STACK_{name}_PORT"] = str(port)
    env["OTEL_TRAIN_STACK_RUN"] = str(run_dir)
    env.update(env_extra)
    up = subprocess.run([*STACK, "up"], env=env, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((run_dir / "state.json").read_text())
    pids = [svc["pid"] for svc in state["services"].values()]
    try:
        yield {"env": env, "ports": ports}
    finally:
        down = subprocess.run(
            [*STACK, "down"], env=env, capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stdout + down.stderr
        for pid in pids:
            assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"pid {pid} survived"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except OSError:
        return True


def prom(stack: Any, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{stack['ports']['PROMETHEUS']}{path}?" + urllib.parse.urlencode(params)
    body = get_json(url)
    assert body["status"] == "success", body
    return body["data"]


def _rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def jaeger_chunks(stack: Any, service: str, start: float) -> Iterator[dict[str, Any]]:
    """The resourceSpans of ``service``'s traces since ``start``, from Jaeger's /api/v3."""
    params = {
        "query.service_name": service,
        "query.start_time_min": _rfc3339(start - 60),
        "query.start_time_max": _rfc3339(time.time() + 60),
        "query.num_traces": "1000",
    }
    url = f"http://127.0.0.1:{stack['ports']['JAEGER_UI']}/api/v3/traces?"
    with urllib.request.urlopen(url + urllib.parse.urlencode(params), timeout=10) as r:
        text = r.read().decode()
    # The HTTP gateway may stream several {"result": ...} chunks back to back.
    decoder, pos = json.JSONDecoder(), 0
    while pos < len(text.rstrip()):
        body, pos = decoder.raw_decode(text, pos)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        yield from body.get("result", {}).get("resourceSpans", [])


def jaeger_traces(stack: Any, service: str, start: float) -> list[dict[str, Any]]:
    return [
        span
        for rs in jaeger_chunks(stack, service, start)
        for ss in rs.get("scopeSpans", [])
        for span in ss.get("spans", [])
    ]


def attrs(span: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        out[a["key"]] = next(iter(v.values())) if v else None
    return out


def dashboard(name: str) -> dict[str, Any]:
    return json.loads((DASHBOARDS / f"{name}.json").read_text())  # type: ignore[no-any-return]


def dashboard_queries(name: str, logs: bool = False) -> list[tuple[str, str]]:
    """(panel title [refId], expr) of every PromQL panel query of
    ``grafana/dashboards/<name>.json``, or with ``logs`` of every other (the log store's
    LogsQL)."""
    return [
        (f"{p['title']} [{t['refId']}]", t["expr"])
        for p in dashboard(name)["panels"]
        for t in p["targets"]
        if (t["datasource"]["type"] == "prometheus") != logs
    ]


# Panels a single-process run has no data for: the time in collectives (a torchrun job's:
# test_torchrun_ranks.py runs them).
SINGLE_PROCESS_EMPTY = ("Time in collectives (share of step time)",)


def log_records(stack: Any, query: str) -> list[dict[str, Any]]:
    """The records a LogsQL query finds in the stack's VictoriaLogs (one JSON a line)."""
    url = f"http://127.0.0.1:{stack['ports']['VICTORIALOGS']}/select/logsql/query?"
    with urllib.request.urlopen(url + urllib.parse.urlencode({"query": query}), timeout=10) as r:
        return [json.loads(line) for line in r.read().decode().splitlines() if line.strip()]


def query_data(
    stack: Any, expr: str, job: str, start: float, end: float | None = None
) -> list[Any]:
    """The series of a panel query with $job = ``job`` and every rank, over the run (from
    ``start`` to ``end``, default now)."""
    query = expr.replace("$job", job).replace("$rank", ".*").replace("$__rate_interval", "1m")
    end = time.time() if end is None else end
    result = prom(
        stack, "/api/v1/query_range", query=query, start=str(start), end=str(end), step="2"
    )["result"]
    return [r for r in result if any(v[1] not in ("NaN", "+Inf", "-Inf") for v in r["values"])]


def variable_values(stack: Any, name: str, var: str, start: float, **values: str) -> list[str]:
    """The options Grafana offers for ``$var`` of dashboard ``name``: its
    ``label_values(selector, label)`` query through Prometheus's label values API."""
    query = next(v for v in dashboard(name)["templating"]["list"] if v["name"] == var)
    found = re.fullmatch(r"label_values\((.+), (\w+)\)", query["query"]["query"])
    assert found, query
    selector, label = found.groups()
    for key, value in values.items():
        selector = selector.replace(f"${key}", value)
    params = {"match[]": selector, "start": str(start - 60), "end": str(time.time())}
    return list(prom(stack, f"/api/v1/label/{label}/values", **params))
