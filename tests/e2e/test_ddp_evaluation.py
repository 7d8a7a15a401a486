"""DDP at 2 ranks under torchrun (gloo, CPU) as real jobs are written (issue 38 item 6):
after each ``opt.step()`` the loss is averaged over the ranks for the log with
``dist.all_reduce(loss)``, and after each epoch an evaluation under ``torch.no_grad()``
gathers every rank's predictions (``all_gather``) and sums the correct ones
(``all_reduce``). Those collectives run with no step open: each rank's record has one
step an iteration, each with its data, forward, backward and optimizer phases and its
batch's samples; and the weights trained are bit for bit those of the same job without
otel-train."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from scratch import job_env

from otel_train import contract as c

EPOCHS, BATCH, SAMPLES = 2, 8, 64  # per rank: 64 / 2 ranks / 8 = 4 batches an epoch
ITERATIONS = EPOCHS * SAMPLES // 2 // BATCH
PHASES = ["data", "forward", "backward", "optimizer"]

TRAIN = textwrap.dedent(f"""
    import os, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn({SAMPLES}, 16, generator=g),
                                          torch.randint(0, 4, ({SAMPLES},), generator=g))
    sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=True, seed=2)
    loader = torch.utils.data.DataLoader(data, batch_size={BATCH}, sampler=sampler)
    test = torch.utils.data.DataLoader(data, batch_size=16,
        sampler=torch.utils.data.distributed.DistributedSampler(data, shuffle=False))
    if sys.argv[2] == "instrumented":
        import otel_train
        otel_train.instrument(model, optimizer=opt, dataloader=loader, run_dir=sys.argv[1],
                              trace_steps="all", console="off", prometheus=False)
    iterations = 0
    for epoch in range({EPOCHS}):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            logged = loss.detach().clone()
            dist.all_reduce(logged)  # the loss averaged over the ranks, for the log
            iterations += 1
        model.eval()
        with torch.no_grad():
            correct = torch.zeros(())
            for x, y in test:
                pred = model(x).argmax(1)
                gathered = [torch.empty_like(pred) for _ in range(world)]
                dist.all_gather(gathered, pred)
                correct += (pred == y).sum()
            dist.all_reduce(correct)
    assert iterations == {ITERATIONS}
    torch.save(model.module.state_dict(), os.path.join(sys.argv[1], f"{{sys.argv[2]}}{{rank}}.pt"))
    if sys.argv[2] == "instrumented":
        assert otel_train.shutdown()
    dist.destroy_process_group()
""")


def torchrun(tmp: Path, mode: str) -> None:
    script = tmp / "train.py"
    script.write_text(TRAIN)
    env = {**job_env(), "OTEL_TRAIN_RUN_ID": "ddp-eval", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run([*cmd, str(script), str(tmp), mode], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def record_spans(path: Path) -> list[dict[str, Any]]:
    return [s for line in path.read_text().splitlines()
            for rs in json.loads(line)["resourceSpans"]
            for ss in rs["scopeSpans"] for s in ss["spans"]]  # fmt: skip


def attribute(span: dict[str, Any], key: str) -> Any:
    for a in span.get("attributes", ()):
        if a["key"] == key:
            return next(iter(a["value"].values()))
    return None


def test_evaluation_gathers_and_a_logged_all_reduce_add_no_steps(tmp_path: Path) -> None:
    torchrun(tmp_path, "plain")
    torchrun(tmp_path, "instrumented")
    (run,) = tmp_path.glob("*-ddp-eval")
    for rank in (0, 1):
        spans = record_spans(run / f"rank{rank}.traces.jsonl")
        steps = [s for s in spans if s["name"] == c.STEP_SPAN.name]
        assert len(steps) == ITERATIONS, Counter(s["name"] for s in spans)
        for step in steps:
            assert int(attribute(step, c.STEP_SAMPLES.key)) == BATCH
            phases = [s for s in spans if s.get("parentSpanId") == step["spanId"]]
            names = [s["name"] for s in sorted(phases, key=lambda s: int(s["startTimeUnixNano"]))]
            assert [n for n in names if n in PHASES] == PHASES, names
        plain = torch.load(tmp_path / f"plain{rank}.pt")
        trained = torch.load(tmp_path / f"instrumented{rank}.pt")
        assert all(torch.equal(trained[k], plain[k]) for k in plain)


@pytest.fixture(autouse=True)
def _quiet_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
