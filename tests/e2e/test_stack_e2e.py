"""End to end against the real stack on loopback: the Collector, Jaeger v2 and Prometheus
built by ``scripts/stack build``, started from the deploy/ configs.

Two instrumented training runs (a plain loop and the RL method-map shape) export over
OTLP/HTTP to the Collector. Then: Jaeger's ``/api/v3/traces`` holds their step -> phase
trees, Prometheus holds the phase duration, memory and throughput series with exemplars
pointing at those traces, and every query of every dashboard panel returns data from the
run. Stopping the stack leaves no process behind.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.machinery
import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_train import contract as c

ROOT = Path(__file__).resolve().parents[2]
STACK = [sys.executable, str(ROOT / "scripts" / "stack")]
pytestmark = pytest.mark.stack


def _stack_ports() -> list[str]:
    """The port names scripts/stack knows (it has no .py suffix: load it by path)."""
    loader = importlib.machinery.SourceFileLoader("otel_train_stack_e2e", STACK[1])
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return list(module.PORTS)


PORT_NAMES = _stack_ports()

PLAIN = textwrap.dedent("""
    import os, sys, time, torch, otel_train
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(100, 32), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ids, labels = torch.randint(0, 100, (256, 8)), torch.randint(0, 4, (256,))
    rows = [{"input_ids": ids[i], "labels": labels[i]} for i in range(256)]
    loader = torch.utils.data.DataLoader(rows, batch_size=16)
    # A CPU has no datasheet peak: give one so MFU is exported like on a listed GPU.
    otel_train.instrument(model, optimizer=opt, dataloader=loader, peak_tflops=0.5)
    steps = int(sys.argv[1])
    done = 0
    while done < steps:
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["input_ids"]), batch["labels"])
            opt.zero_grad(); loss.backward(); opt.step()
            otel_train.record(loss=loss.detach())
            done += 1
            time.sleep(0.05)
            if done == steps:
                break
    time.sleep(float(sys.argv[2]))   # keep /metrics up for Prometheus's scrape
    assert otel_train.shutdown(), "shutdown missed its deadline"
""")

RL = textwrap.dedent("""
    import sys, time, torch, otel_train

    class Loop:
        def __init__(self):
            self.policy = torch.nn.Linear(8, 2)
            self.opt = torch.optim.SGD(self.policy.parameters(), lr=0.01)
        def generate(self):
            time.sleep(0.03)
            return torch.randn(32, 8)
        def train_step(self, obs):
            loss = self.policy(obs).pow(2).mean()
            loss.backward()
            return loss
        def optim_step(self):
            self.opt.step(); self.opt.zero_grad()
        def sync_weights(self):
            time.sleep(0.01)
        def run_iteration(self, i):
            obs = self.generate()
            self.train_step(obs)
            self.optim_step()
            self.sync_weights()
            otel_train.record(reward=float(i % 7))

    loop = Loop()
    otel_train.instrument(loop, phases={"rollout": "generate", "train": "train_step",
                                        "optimizer": "optim_step", "weight_sync": "sync_weights"},
                          step="run_iteration")
    for i in range(int(sys.argv[1])):
        loop.run_iteration(i)
    time.sleep(2.5)
    assert otel_train.shutdown(), "shutdown missed its deadline"
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    with socket.socket() as s:
        # As http.server binds: a port left in TIME_WAIT by an earlier run is free to use.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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
    """``scripts/stack up`` on free loopback ports in ``run_dir``; down (and every process
    gone) on exit. Skips, or fails under OTEL_TRAIN_STACK_REQUIRED=1, when not built."""
    if subprocess.run([*STACK, "built"], capture_output=True).returncode != 0:
        reason = "stack binaries not built: run scripts/stack build (scripts/test does)"
        if os.environ.get("OTEL_TRAIN_STACK_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    env = dict(os.environ)
    ports = {}
    for name in PORT_NAMES:
        ports[name] = free_port()
        env[f"OTEL_TRAIN_STACK_{name}_PORT"] = str(ports[name])
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


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_stack(tmp_path_factory.mktemp("stack-run")) as running:
        yield running


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except OSError:
        return True


def run_job(
    stack: Any, script: str, args: list[str], service: str, tmp: Path, prometheus: bool
) -> None:
    path = tmp / f"{service}.py"
    path.write_text(script)
    env = dict(os.environ)
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}",
            "OTEL_SERVICE_NAME": service,
            "OTEL_TRAIN_METRIC_EXPORT_INTERVAL": "0.5",
            "OTEL_TRAIN_TRACE_STEPS": "all",
            "OTEL_TRAIN_CONSOLE": "off",
            "OTEL_TRAIN_PROMETHEUS": "true" if prometheus else "false",
            "OTEL_TRAIN_PROMETHEUS_PORT": "9464",
        }
    )
    done = subprocess.run(
        [sys.executable, str(path), *args], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def runs(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("jobs")
    tag = uuid.uuid4().hex[:8]
    plain, rl = f"e2e-plain-{tag}", f"e2e-rl-{tag}"
    start = time.time()
    # The plain run also serves /metrics on 9464, the in-process scrape target of
    # deploy/prometheus.yml, and stays up past one 15 s scrape interval.
    scrape = port_free(9464)
    run_job(stack, PLAIN, ["40", "17" if scrape else "2.5"], plain, tmp, prometheus=scrape)
    # Each run spans several export intervals, so rate() sees its counters move.
    run_job(stack, RL, ["60"], rl, tmp, prometheus=False)
    return {
        "plain": plain,
        "rl": rl,
        "start": start,
        "steps": {"plain": 40, "rl": 60},
        "scrape": scrape,
    }


def prom(stack: Any, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{stack['ports']['PROMETHEUS']}{path}?" + urllib.parse.urlencode(params)
    body = get_json(url)
    assert body["status"] == "success", body
    return body["data"]


def jaeger_traces(stack: Any, service: str, start: float) -> list[dict[str, Any]]:
    def rfc3339(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    params = {
        "query.service_name": service,
        "query.start_time_min": rfc3339(start - 60),
        "query.start_time_max": rfc3339(time.time() + 60),
        "query.num_traces": "1000",
    }
    url = f"http://127.0.0.1:{stack['ports']['JAEGER_UI']}/api/v3/traces?" + urllib.parse.urlencode(
        params
    )
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    # The HTTP gateway may stream several {"result": ...} chunks back to back.
    spans, decoder, pos = [], json.JSONDecoder(), 0
    while pos < len(text.rstrip()):
        body, end = decoder.raw_decode(text, pos)
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
        for rs in body.get("result", {}).get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                spans.extend(ss.get("spans", []))
    return spans


def attrs(span: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        out[a["key"]] = next(iter(v.values())) if v else None
    return out


@pytest.mark.parametrize(
    ("kind", "phases"),
    [
        ("plain", {"data", "forward", "backward", "optimizer"}),
        ("rl", {"rollout", "train", "optimizer", "weight_sync"}),
    ],
)
def test_jaeger_holds_the_step_phase_trees(
    stack: Any, runs: dict[str, Any], kind: str, phases: set[str]
) -> None:
    n = runs["steps"][kind]

    def steps_seen() -> list[dict[str, Any]]:
        spans = jaeger_traces(stack, runs[kind], runs["start"])
        roots = [s for s in spans if s["name"] == c.STEP_SPAN.name]
        return spans if len(roots) >= n else []

    spans = poll(steps_seen, f"{n} step traces of {runs[kind]} in Jaeger")
    roots = [s for s in spans if s["name"] == c.STEP_SPAN.name]
    assert sorted(int(attrs(r)[c.STEP_INDEX.key]) for r in roots) == list(range(n))
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_trace.setdefault(s["traceId"], []).append(s)
    for root in roots:
        assert not root.get("parentSpanId")
        kids = [s for s in by_trace[root["traceId"]] if s.get("parentSpanId") == root["spanId"]]
        assert {k["name"] for k in kids} == phases
        for k in kids:
            a = attrs(k)
            assert a[c.PHASE_NAME.key] == k["name"]
            assert a[c.PHASE_CLOCK.key] == "host"
            assert float(a[c.PHASE_HOST_DURATION.key]) > 0
            assert c.PHASE_DEVICE_DURATION.key not in a  # CPU run: absent, never zero
            assert int(k["startTimeUnixNano"]) >= int(root["startTimeUnixNano"])
            assert int(k["endTimeUnixNano"]) <= int(root["endTimeUnixNano"])
        ra = attrs(root)
        assert int(ra[c.RANK.key]) == 0
        if kind == "plain":
            assert int(ra[c.STEP_SAMPLES.key]) == 16
            assert int(ra[c.STEP_TOKENS.key]) == 16 * 8


def test_prometheus_holds_phase_memory_and_throughput_series(
    stack: Any, runs: dict[str, Any]
) -> None:
    job = runs["plain"]
    sel = f'{{job="{job}"}}'
    count = c.prometheus_base_name(c.PHASE_DURATION) + "_count"
    result = poll(
        lambda: prom(stack, "/api/v1/query", query=f"max_over_time({count}{sel}[10m])")["result"],
        "phase duration series",
    )
    per_phase = {r["metric"]["phase"]: float(r["value"][1]) for r in result}
    assert per_phase == {p: 40.0 for p in ("data", "forward", "backward", "optimizer")}
    assert {r["metric"]["otel_train_rank"] for r in result} == {"0"}
    for spec in (
        c.PROCESS_MEMORY_RSS,
        c.THROUGHPUT_SAMPLES,
        c.THROUGHPUT_TOKENS,
        c.STEPS,
        c.SAMPLES,
        c.TOKENS,
    ):
        got = prom(
            stack, "/api/v1/query", query=f"max_over_time({c.prometheus_base_name(spec)}{sel}[10m])"
        )["result"]
        assert got, f"no {spec.name} series"
        assert float(got[0]["value"][1]) > 0
    total = prom(
        stack,
        "/api/v1/query",
        query=f"max_over_time({c.prometheus_base_name(c.SAMPLES)}{sel}[10m])",
    )["result"]
    assert float(total[0]["value"][1]) == 40 * 16


def test_exemplars_point_at_exported_traces(stack: Any, runs: dict[str, Any]) -> None:
    job = runs["plain"]
    bucket = c.prometheus_base_name(c.STEP_DURATION) + "_bucket"
    data = poll(
        lambda: prom(
            stack,
            "/api/v1/query_exemplars",
            query=f'{bucket}{{job="{job}"}}',
            start=str(runs["start"] - 60),
            end=str(time.time() + 60),
        ),
        "exemplars",
    )
    trace_ids = {e["labels"]["trace_id"] for series in data for e in series["exemplars"]}
    jaeger_ids = {s["traceId"] for s in jaeger_traces(stack, job, runs["start"])}
    assert trace_ids and trace_ids <= jaeger_ids


def _dashboard_queries() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted((ROOT / "grafana" / "dashboards").glob("*.json")):
        dash = json.loads(path.read_text())
        for p in dash["panels"]:
            for t in p["targets"]:
                out.append((path.stem, f"{p['title']} [{t['refId']}]", t["expr"]))
    return out


@pytest.mark.parametrize(
    ("dashboard", "panel", "expr"),
    _dashboard_queries(),
    ids=[f"{d}:{p}" for d, p, _ in _dashboard_queries()],
)
def test_every_dashboard_query_returns_data_from_the_run(
    stack: Any, runs: dict[str, Any], dashboard: str, panel: str, expr: str
) -> None:
    job = runs["rl"] if dashboard == "rl-loop" else runs["plain"]
    query = expr.replace("$job", job).replace("$rank", ".*").replace("$__rate_interval", "1m")
    end = time.time()

    def has_data() -> list[Any]:
        result = prom(
            stack,
            "/api/v1/query_range",
            query=query,
            start=str(runs["start"]),
            end=str(end),
            step="2",
        )["result"]
        return [r for r in result if any(v[1] not in ("NaN", "+Inf", "-Inf") for v in r["values"])]

    assert poll(has_data, f"data for {dashboard} / {panel}", timeout=30)


def test_dashboard_variables_list_the_run(stack: Any, runs: dict[str, Any]) -> None:
    steps = c.prometheus_base_name(c.STEPS)
    jobs = prom(stack, "/api/v1/label/job/values", **{"match[]": steps})
    assert runs["plain"] in jobs and runs["rl"] in jobs
    ranks = prom(
        stack,
        "/api/v1/label/otel_train_rank/values",
        **{"match[]": f'{steps}{{job="{runs["plain"]}"}}'},
    )
    assert ranks == ["0"]


def test_scraped_series_are_labelled_and_not_double_counted(
    stack: Any, runs: dict[str, Any]
) -> None:
    if not runs["scrape"]:
        pytest.skip("port 9464 was busy: the in-process scrape target could not be served")
    steps = c.prometheus_base_name(c.STEPS)
    scraped = poll(
        lambda: prom(
            stack,
            "/api/v1/query",
            query=f'max_over_time({steps}{{otel_train_source="scrape"}}[10m])',
        )["result"],
        "a scrape of the in-process /metrics",
    )
    assert all(r["metric"]["job"] == "otel-train-inprocess" for r in scraped)
    otlp = prom(
        stack,
        "/api/v1/query",
        query=f'max_over_time({steps}{{job="{runs["plain"]}", otel_train_source=""}}[10m])',
    )["result"]
    assert [float(r["value"][1]) for r in otlp] == [40.0]
