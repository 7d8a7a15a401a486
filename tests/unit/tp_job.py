"""A tensor-parallel MLP at 2 ranks under torchrun (gloo, CPU): ColwiseParallel then
RowwiseParallel, instrumented with one call, its counted step's FLOPs written per rank.

Usage: ``torchrun --standalone --nproc_per_node=2 tp_job.py OUT_DIR``; each rank writes
``OUT_DIR/rank<r>.json`` with the counted step's FLOPs and the model's sizes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from otel_helpers import providers, step_spans
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

BATCH, WIDTH, HIDDEN = 8, 16, 32


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, WIDTH, bias=False),
    )
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, trace_steps="all", console="off",
                          flops_count_step=0, **providers(tel))  # fmt: skip
    for _ in range(3):
        x = torch.randn(BATCH, WIDTH)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    otel_train.shutdown()
    steps = [dict(s.attributes) for s in step_spans(tel.spans())]
    counted = [s[c.STEP_FLOPS.key] for s in steps if s.get(c.STEP_FLOPS_COUNTED.key)]
    later = [s.get(c.STEP_FLOPS.key) for s in steps if not s.get(c.STEP_FLOPS_COUNTED.key)]
    facts = {"counted": counted, "later": later, "batch": BATCH, "width": WIDTH,
             "hidden": HIDDEN, "world": dist.get_world_size()}  # fmt: skip
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(facts))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
