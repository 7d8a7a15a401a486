"""A real hang against the real stack: ``torchrun --nproc_per_node=2`` DDP training (gloo,
CPU) with ``hang_after=8``, rank 1 sleeping 30 s in its forward pass at step 10 (outside
any collective) while rank 0 waits for it in DDP's gradient all-reduce.

Then VictoriaLogs holds each rank's otel_train.hang record and its otel_train.hang.resolved
record, found by the training dashboard's own LogsQL query: rank 1's names no collective
and its stacks show the sleep, rank 0's names the collective it waits in; their trace ids
are the open step's trace in Jaeger. Prometheus fired OtelTrainRankStalled for both ranks
and OtelTrainRankHoldsJob for rank 1 alone, and both ranks' progress age passed 8 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any

import pytest
from stack_helpers import dashboard_queries, jaeger_traces, log_records, poll, prom, running_stack

from otel_train import contract as c

pytestmark = pytest.mark.stack
HANG_AFTER = 8

TRAIN = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist, otel_train
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, step = dist.get_rank(), [0]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                            torch.nn.Linear(32, 4))
        def forward(self, x):
            if rank == 1 and step[0] == 10:
                time.sleep(30)   # the stall: outside any collective
            return self.body(x)

    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(20)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    otel_train.instrument(model, optimizer=opt, dataloader=loader)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        step[0] += 1
        time.sleep(0.25)   # the job goes on for a few seconds after the stall
    assert otel_train.shutdown(), "shutdown missed its deadline"
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("hang")
    with running_stack(tmp / "stack") as stack:
        (tmp / "train.py").write_text(TRAIN)
        service = f"hang2-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}",
                "OTEL_SERVICE_NAME": service,
                "OTEL_TRAIN_HANG_AFTER": str(HANG_AFTER),
                "OTEL_TRAIN_METRIC_EXPORT_INTERVAL": "1",
                "OTEL_TRAIN_CONSOLE": "off",
                "OTEL_TRAIN_PROMETHEUS": "false",
                "OMP_NUM_THREADS": "1",
                "OTEL_TRAIN_RUN_DIR": str(tmp / "runs"),  # run records: not in the checkout
            }
        )
        start = time.time()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc_per_node=2", str(tmp / "train.py")]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        yield {"stack": stack, "service": service, "start": start, "out": done.stdout}


def records(run: Any) -> dict[tuple[str, str], list[dict[str, Any]]]:
    ((_, expr),) = dashboard_queries("training-overview", logs=True)
    query = expr.replace("$job", run["service"]).replace("${rank:regex}", ".*")
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in log_records(run["stack"], query):
        out.setdefault((r[c.RESOURCE_RANK.key], r["event_name"]), []).append(r)
    return out


def test_each_rank_reports_its_hang_in_the_log_store(run: Any) -> None:
    want = {(str(r), e) for r in (0, 1) for e in (c.HANG_EVENT, c.HANG_RESOLVED_EVENT)}
    found = poll(lambda: want <= set(records(run)) and records(run), "each rank's records")
    assert set(found) == want
    for rank in ("0", "1"):
        hangs = found[(rank, c.HANG_EVENT)]
        assert 1 <= len(hangs) <= 3
        first = min(hangs, key=lambda r: float(r[c.HANG_SECONDS.key]))
        assert float(first[c.HANG_SECONDS.key]) >= HANG_AFTER
        assert float(first[c.HANG_AFTER.key]) == HANG_AFTER
        (resolved,) = found[(rank, c.HANG_RESOLVED_EVENT)]
        assert float(resolved[c.HANG_SECONDS.key]) >= HANG_AFTER
    sleeper = min(found[("1", c.HANG_EVENT)], key=lambda r: float(r[c.HANG_SECONDS.key]))
    assert not sleeper.get(c.COLLECTIVE_OP.key)  # outside any collective
    assert "time.sleep(30)" in sleeper[c.HANG_STACKTRACE.key]
    assert sleeper[c.PHASE_NAME.key] == "forward"
    waiter = min(found[("0", c.HANG_EVENT)], key=lambda r: float(r[c.HANG_SECONDS.key]))
    assert waiter.get(c.COLLECTIVE_OP.key)  # DDP's gradient all-reduce
    assert waiter[c.STEP_INDEX.key] == sleeper[c.STEP_INDEX.key] == "10"


def test_the_records_name_the_open_steps_trace(run: Any) -> None:
    hangs = [r for (_, e), rs in records(run).items() if e == c.HANG_EVENT for r in rs]
    ids = {r["trace_id"] for r in hangs}
    assert ids and "" not in ids

    def traced() -> bool:
        spans = jaeger_traces(run["stack"], run["service"], run["start"])
        return ids <= {s["traceId"] for s in spans}

    assert poll(traced, "the hung steps' traces in Jaeger")


def fired(run: Any, alert: str) -> set[str]:
    query = (
        f'max by (otel_train_rank) (max_over_time(ALERTS{{alertname="{alert}", '
        f'alertstate="firing", job="{run["service"]}"}}[15m]))'
    )
    return {
        r["metric"]["otel_train_rank"]
        for r in prom(run["stack"], "/api/v1/query", query=query)["result"]
    }


def test_prometheus_fired_the_stall_for_both_and_named_the_holder(run: Any) -> None:
    assert poll(lambda: fired(run, "OtelTrainRankStalled") == {"0", "1"}, "both ranks stalled")
    assert fired(run, "OtelTrainRankHoldsJob") == {"1"}
    age = c.prometheus_base_name(c.PROGRESS_AGE)
    query = f'max by (otel_train_rank) (max_over_time({age}{{job="{run["service"]}"}}[15m]))'
    result = prom(run["stack"], "/api/v1/query", query=query)["result"]
    assert {r["metric"]["otel_train_rank"]: float(r["value"][1]) > HANG_AFTER for r in result} == {
        "0": True,
        "1": True,
    }
