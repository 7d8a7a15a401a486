"""2 and 4 ranks under torchrun against the real stack: identity per rank, a straggler found.

``torchrun --nproc_per_node=N`` runs DDP training (gloo, CPU) instrumented with one call to
``otel_train.instrument``; one rank sleeps in its forward pass (SLOW_RANK in the training
script's environment: rank 1 of 2, rank 2 of 4). The ranks export over OTLP/HTTP to the
Collector started from deploy/ on free loopback ports; both jobs go to one stack. Then
Jaeger holds step traces of every rank with their resource attributes, Prometheus holds
per-rank series, the straggler rules of deploy/prometheus/rules/stragglers.yml (loaded
here with a 1 s group interval and a 3 s ``for:``, nothing else changed) give the slow rank
the lowest score and name it alone in OtelTrainStraggler (with 2 ranks the healthy rank
waits as long in its backward as the slow one spends in its forward: the rules must not
name it), and every query of the training overview returns data for the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from stack_helpers import (
    attrs,
    dashboard_queries,
    jaeger_chunks,
    jaeger_traces,
    poll,
    prom,
    query_data,
    running_stack,
)

from otel_train import contract as c

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.stack
WORLDS = {2: 1, 4: 2}  # ranks -> the slow rank
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
            self.body = torch.nn.Sequential(torch.nn.EmbeddingBag(100, 32), torch.nn.Linear(32, 64),
                                            torch.nn.ReLU(), torch.nn.Linear(64, 4))
        def forward(self, input_ids):
            if slow:
                time.sleep(0.06)   # the straggler: a slow forward pass on one rank
            return self.body(input_ids)

    torch.manual_seed(rank)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [{"input_ids": torch.randint(0, 100, (8, 16)), "labels": torch.randint(0, 4, (8,))}
            for _ in range(16)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    # A CPU has no datasheet peak: give one so MFU is exported like on a listed GPU.
    otel_train.instrument(model, optimizer=opt, dataloader=loader, peak_tflops=0.5)
    done, steps = 0, int(os.environ["STEPS"])
    while done < steps:
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["input_ids"]), batch["labels"])
            opt.zero_grad(); loss.backward(); opt.step()
            otel_train.record(loss=loss.detach())
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
    config = fast_rules(tmp_path_factory.mktemp("torchrun-config"))
    run = tmp_path_factory.mktemp("torchrun-stack")
    with running_stack(run, OTEL_TRAIN_STACK_PROMETHEUS_CONFIG=str(config)) as running:
        yield running


@pytest.fixture(scope="module", params=sorted(WORLDS), ids=lambda n: f"{n}-ranks")
def run(stack: Any, tmp_path_factory: pytest.TempPathFactory, request: Any) -> dict[str, Any]:
    ranks, slow = request.param, WORLDS[request.param]
    tmp = tmp_path_factory.mktemp("torchrun")
    script = tmp / "train.py"
    script.write_text(TRAIN)
    service = f"ddp{ranks}-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}",
            "OTEL_SERVICE_NAME": service,
            "OTEL_TRAIN_METRIC_EXPORT_INTERVAL": "0.5",
            "OTEL_TRAIN_CONSOLE": "off",
            "OTEL_TRAIN_PROMETHEUS": "false",
            "OMP_NUM_THREADS": "1",
            "SLOW_RANK": str(slow),
            "STEPS": str(STEPS),
        }
    )
    start = time.time()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={ranks}", str(script)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return {"service": service, "start": start, "ranks": ranks, "slow": slow}


def test_jaeger_holds_traces_of_every_rank_with_their_identity(
    stack: Any, run: dict[str, Any]
) -> None:
    def first_steps() -> dict[int, dict[str, Any]]:
        # The resource attributes ride on the resourceSpans; the rank also on each step span.
        spans = jaeger_traces(stack, run["service"], run["start"])
        roots = [s for s in spans if s["name"] == c.STEP_SPAN.name]
        by_rank = {int(attrs(s)[c.RANK.key]): s for s in roots}
        return by_rank if len(by_rank) == run["ranks"] else {}

    by_rank = poll(first_steps, f"step traces of {run['ranks']} ranks in Jaeger")
    assert sorted(by_rank) == list(range(run["ranks"]))
    resources = jaeger_resources(stack, run)
    assert sorted(int(r[c.RESOURCE_RANK.key]) for r in resources) == list(range(run["ranks"]))
    for r in resources:
        assert int(r[c.RESOURCE_WORLD_SIZE.key]) == run["ranks"]
        assert int(r[c.RESOURCE_LOCAL_RANK.key]) == int(r[c.RESOURCE_RANK.key])
        assert int(r[c.RESOURCE_NODE_RANK.key]) == 0
    assert len({r["service.instance.id"] for r in resources}) == run["ranks"]
    assert len({r[c.RESOURCE_JOB.key] for r in resources}) == 1  # torchrun's run id


def jaeger_resources(stack: Any, run: dict[str, Any]) -> list[dict[str, Any]]:
    """One attribute dict per distinct resource in the service's traces."""
    seen: dict[str, dict[str, Any]] = {}
    for rs in jaeger_chunks(stack, run["service"], run["start"]):
        a = attrs(rs.get("resource", {}))
        seen[a["service.instance.id"]] = a
    return list(seen.values())


def test_prometheus_holds_per_rank_series(stack: Any, run: dict[str, Any]) -> None:
    count = c.prometheus_base_name(c.PHASE_DURATION) + "_count"
    sel = f'{{job="{run["service"]}", phase="forward"}}'

    def per_rank() -> dict[str, float]:
        got = prom(stack, "/api/v1/query", query=f"max_over_time({count}{sel}[10m])")["result"]
        out = {r["metric"]["otel_train_rank"]: float(r["value"][1]) for r in got}
        return out if len(out) == run["ranks"] and all(v == STEPS for v in out.values()) else {}

    counts = poll(per_rank, "forward phase counts of every rank")
    assert counts == {str(r): float(STEPS) for r in range(run["ranks"])}


def test_straggler_rule_names_the_slow_rank(stack: Any, run: dict[str, Any]) -> None:
    job = run["service"]

    def alerts() -> list[dict[str, Any]]:
        return [
            a
            for a in prom(stack, "/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == "OtelTrainStraggler"
            and a["labels"].get("job") == job
        ]

    poll(
        lambda: [a for a in alerts() if a["state"] == "firing"],
        "the OtelTrainStraggler alert",
        timeout=60,
    )
    # Only the slowed rank, neither firing nor pending for any other.
    assert {a["labels"]["otel_train_rank"] for a in alerts()} == {str(run["slow"])}
    scores = prom(
        stack, "/api/v1/query", query=f'job_rank:otel_train_straggler_score:min{{job="{job}"}}'
    )["result"]
    by_rank = {r["metric"]["otel_train_rank"]: float(r["value"][1]) for r in scores}
    assert set(by_rank) == {str(r) for r in range(run["ranks"])}
    assert min(by_rank, key=by_rank.__getitem__) == str(run["slow"])
    assert all(v >= 0.7 for r, v in by_rank.items() if r != str(run["slow"]))
    section = prom(
        stack,
        "/api/v1/query",
        query=f'min by (phase) (job_rank_phase:otel_train_straggler_score:ratio{{job="{job}", '
        f'otel_train_rank="{run["slow"]}"}})',
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
    assert len(steps) == run["ranks"]
    assert all(float(r["value"][1]) >= 0.7 for r in steps), steps


@pytest.mark.parametrize(
    ("panel", "expr"),
    dashboard_queries("training-overview"),
    ids=[panel for panel, _ in dashboard_queries("training-overview")],
)
def test_every_overview_query_returns_data_for_the_job(
    stack: Any, run: dict[str, Any], panel: str, expr: str
) -> None:
    assert poll(
        lambda: query_data(stack, expr, run["service"], run["start"]),
        f"data for training-overview / {panel} from the {run['ranks']}-rank job",
        timeout=30,
    )
