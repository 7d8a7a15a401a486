"""Four ranks under torchrun against the real stack: identity per rank and a straggler found.

``torchrun --nproc_per_node=4`` runs DDP training (gloo, CPU) instrumented with one call to
``otel_train.instrument``; rank 2 sleeps in its forward pass (SLOW_RANK=2 in the training
script's environment). The ranks export over OTLP/HTTP to the Collector started from
deploy/ on free loopback ports. Then Jaeger holds step traces of all four ranks with their
resource attributes, Prometheus holds per-rank series, and the straggler rules of
deploy/prometheus/rules/stragglers.yml (loaded here with a 1 s group interval and a 3 s
``for:``, nothing else changed) give rank 2 the lowest score and fire OtelTrainStraggler
for rank 2 alone.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_stack_e2e import attrs, jaeger_traces, poll, prom, running_stack

from otel_train import contract as c

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.stack
RANKS = 4
SLOW_RANK = 2
STEPS = 40

TRAIN = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist, otel_train
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    slow = int(os.environ["SLOW_RANK"]) == rank

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                            torch.nn.Linear(64, 4))
        def forward(self, x):
            if slow:
                time.sleep(0.06)   # the straggler: a slow forward pass on one rank
            return self.body(x)

    torch.manual_seed(rank)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(8, 32), torch.randint(0, 4, (8,))) for _ in range(16)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    otel_train.instrument(model, optimizer=opt, dataloader=loader)
    done, steps = 0, int(os.environ["STEPS"])
    while done < steps:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            time.sleep(0.02)
            done += 1
            if done == steps:
                break
    assert otel_train.shutdown(), "shutdown missed its deadline"
    dist.destroy_process_group()
""")


def fast_rules(tmp: Path) -> Path:
    """deploy/prometheus.yml and its straggler rules, with short evaluation intervals only."""
    rules = yaml.safe_load((ROOT / "deploy/prometheus/rules/stragglers.yml").read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "3s"
    (tmp / "rules.yml").write_text(yaml.safe_dump(rules))
    config = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    config["rule_files"] = [str(tmp / "rules.yml")]
    for job in config["scrape_configs"]:
        job["file_sd_configs"] = [{"files": [str(ROOT / "deploy/prometheus/targets/*.yml")]}]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    return tmp / "prometheus.yml"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    run = tmp_path_factory.mktemp("torchrun-stack")
    with running_stack(run, OTEL_TRAIN_STACK_PROMETHEUS_CONFIG=str(fast_rules(run))) as running:
        yield running


@pytest.fixture(scope="module")
def run(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("torchrun")
    script = tmp / "train.py"
    script.write_text(TRAIN)
    service = f"ddp-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ)
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}",
            "OTEL_SERVICE_NAME": service,
            "OTEL_TRAIN_METRIC_EXPORT_INTERVAL": "0.5",
            "OTEL_TRAIN_CONSOLE": "off",
            "OTEL_TRAIN_PROMETHEUS": "false",
            "OMP_NUM_THREADS": "1",
            "SLOW_RANK": str(SLOW_RANK),
            "STEPS": str(STEPS),
        }
    )
    start = time.time()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={RANKS}", str(script)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return {"service": service, "start": start}


def test_jaeger_holds_traces_of_every_rank_with_their_identity(
    stack: Any, run: dict[str, Any]
) -> None:
    def first_steps() -> dict[int, dict[str, Any]]:
        # The resource attributes ride on the resourceSpans; the rank also on each step span.
        spans = jaeger_traces(stack, run["service"], run["start"])
        roots = [s for s in spans if s["name"] == c.STEP_SPAN.name]
        by_rank = {int(attrs(s)[c.RANK.key]): s for s in roots}
        return by_rank if len(by_rank) == RANKS else {}

    by_rank = poll(first_steps, f"step traces of {RANKS} ranks in Jaeger")
    assert sorted(by_rank) == list(range(RANKS))
    resources = jaeger_resources(stack, run)
    assert sorted(int(r[c.RESOURCE_RANK.key]) for r in resources) == list(range(RANKS))
    for r in resources:
        assert int(r[c.RESOURCE_WORLD_SIZE.key]) == RANKS
        assert int(r[c.RESOURCE_LOCAL_RANK.key]) == int(r[c.RESOURCE_RANK.key])
        assert int(r[c.RESOURCE_NODE_RANK.key]) == 0
    assert len({r["service.instance.id"] for r in resources}) == RANKS
    assert len({r[c.RESOURCE_JOB.key] for r in resources}) == 1  # torchrun's run id


def jaeger_resources(stack: Any, run: dict[str, Any]) -> list[dict[str, Any]]:
    """One attribute dict per distinct resource in the service's traces."""

    def rfc3339(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    params = {
        "query.service_name": run["service"],
        "query.start_time_min": rfc3339(run["start"] - 60),
        "query.start_time_max": rfc3339(time.time() + 60),
        "query.num_traces": "1000",
    }
    url = f"http://127.0.0.1:{stack['ports']['JAEGER_UI']}/api/v3/traces?"
    with urllib.request.urlopen(url + urllib.parse.urlencode(params), timeout=10) as r:
        text = r.read().decode()
    seen: dict[str, dict[str, Any]] = {}
    decoder, pos = json.JSONDecoder(), 0
    while pos < len(text.rstrip()):
        body, pos = decoder.raw_decode(text, pos)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        for rs in body.get("result", {}).get("resourceSpans", []):
            a = attrs(rs.get("resource", {}))
            seen[a["service.instance.id"]] = a
    return list(seen.values())


def test_prometheus_holds_per_rank_series(stack: Any, run: dict[str, Any]) -> None:
    count = c.prometheus_base_name(c.PHASE_DURATION) + "_count"
    sel = f'{{job="{run["service"]}", phase="forward"}}'

    def per_rank() -> dict[str, float]:
        got = prom(stack, "/api/v1/query", query=f"max_over_time({count}{sel}[10m])")["result"]
        out = {r["metric"]["otel_train_rank"]: float(r["value"][1]) for r in got}
        return out if len(out) == RANKS and all(v == STEPS for v in out.values()) else {}

    counts = poll(per_rank, "forward phase counts of every rank")
    assert counts == {str(r): float(STEPS) for r in range(RANKS)}


def test_straggler_rule_names_the_slow_rank(stack: Any, run: dict[str, Any]) -> None:
    job = run["service"]

    def firing() -> list[dict[str, Any]]:
        alerts = prom(stack, "/api/v1/alerts")["alerts"]
        return [
            a
            for a in alerts
            if a["labels"].get("alertname") == "OtelTrainStraggler"
            and a["labels"].get("job") == job
            and a["state"] == "firing"
        ]

    alerts = poll(firing, "the OtelTrainStraggler alert", timeout=60)
    assert {a["labels"]["otel_train_rank"] for a in alerts} == {str(SLOW_RANK)}
    scores = prom(
        stack, "/api/v1/query", query=f'job_rank:otel_train_straggler_score:min{{job="{job}"}}'
    )["result"]
    by_rank = {r["metric"]["otel_train_rank"]: float(r["value"][1]) for r in scores}
    assert set(by_rank) == {str(r) for r in range(RANKS)}
    assert min(by_rank, key=by_rank.__getitem__) == str(SLOW_RANK)
    assert all(v >= 0.7 for r, v in by_rank.items() if r != str(SLOW_RANK))
    section = prom(
        stack,
        "/api/v1/query",
        query=f'min by (phase) (job_rank_phase:otel_train_straggler_score:ratio{{job="{job}", '
        f'otel_train_rank="{SLOW_RANK}"}})',
    )["result"]
    worst = min(section, key=lambda r: float(r["value"][1]))
    assert worst["metric"]["phase"] == "forward"
    # The all-reduce makes every rank's step as slow as the straggler's: the step time
    # alone does not tell which rank it is (why the rules also score phases).
    steps = prom(
        stack,
        "/api/v1/query",
        query=f'job_rank:otel_train_step_straggler_score:ratio{{job="{job}"}}',
    )["result"]
    assert len(steps) == RANKS
    assert all(float(r["value"][1]) >= 0.7 for r in steps), steps
