"""``otel-train compare`` and the verdicts over two-rank runs: torchrun, DDP on gloo (CPU),
each rank recording into one run directory. In B rank 1 sleeps in its forward pass: the
comparison has a row per rank, forward on rank 1 reads slower, and B's verdicts name
rank 1 as a straggler that works while rank 0 waits for it in the all-reduce."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from scratch import job_env

TRAIN = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist, otel_train
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    slow = int(os.environ["SLOW_RANK"]) == dist.get_rank()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                            torch.nn.Linear(64, 1))
        def forward(self, x):
            if slow:
                time.sleep(0.02)
            return self.body(x)

    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, run_dir=sys.argv[1],
                          trace_steps="all", console="off", prometheus=False)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    assert otel_train.shutdown()
    dist.destroy_process_group()
""")


def _run(tmp: Path, name: str, slow: int) -> Path:
    script = tmp / "train.py"
    script.write_text(TRAIN)
    env = {**job_env(), "OTEL_TRAIN_RUN_ID": name, "SLOW_RANK": str(slow), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run([*cmd, str(script), str(tmp / "runs")], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (run,) = (tmp / "runs").glob(f"*-{name}")
    assert sorted(p.name for p in run.glob("rank*.traces.jsonl")) == [
        "rank0.traces.jsonl", "rank1.traces.jsonl"]  # fmt: skip
    return run


def test_two_rank_runs_compare_per_rank_and_name_the_straggler(tmp_path: Path) -> None:
    a, b = _run(tmp_path, "even", -1), _run(tmp_path, "rank1-slow", 1)
    done = subprocess.run([sys.executable, "-m", "otel_train.cli", "compare", str(a), str(b),
                           "--json"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["a"]["ranks"] == [0, 1] and result["b"]["ranks"] == [0, 1]
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    for r in result["ranks"]:  # every rank's step waits for rank 1's forward (DDP)
        (step,) = r["rows"]
        assert step["verdict"] == "slower", step
    rows = {r["metric"]: r for r in result["rows"]}
    assert rows["phase:forward"]["verdict"] == "slower"  # (pooled: rank 1's 20 ms in it)
    assert rows["collective_wait"]["b_median"] > rows["collective_wait"]["a_median"]
    assert not [line for line in result["verdicts"]["a"] if line.startswith("straggler:")]
    (line,) = [line for line in result["verdicts"]["b"] if line.startswith("straggler:")]
    assert line.startswith("straggler: rank 1's median step less its collective waits is ")
    assert "it mostly works (its own compute)" in line
    text = subprocess.run([sys.executable, "-m", "otel_train.cli", "compare", str(a), str(b)],
                          capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    assert "A: " + str(a) + " (2 ranks): " in text and "\nrank 1:\nstep " in text


@pytest.fixture(autouse=True)
def _quiet_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
