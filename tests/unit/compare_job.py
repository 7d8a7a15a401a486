"""A small instrumented run for the compare and verdict tests: a tiny model fed by a
dataset that sleeps ``--delay`` seconds per sample (a slow input pipeline).

    python compare_job.py RUN_DIR [--delay S] [--steps N] [--trace all|sampled] [--batch N]
                          [--barrier DIR] [--compile] [--export-interval S] [--workers N]

``--compile``: torch.compile the model (Dynamo's eager backend: no C++ compiler needed)
before instrument(); ``--export-interval``: the metric_export_interval setting (0.2).

``--barrier DIR``: once instrumented, write ``DIR/<pid>.ready`` and wait for ``DIR/go``
before the first step, so that jobs started together train at the same time (importing
torch in one would otherwise slow the other's steps).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

import otel_train


class SlowData(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, delay: float) -> None:
        self.delay = delay
        self.x, self.y = torch.randn(n, 16), torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        return self.x[i], self.y[i]


def wait_for_the_others(barrier: Path, timeout_s: float = 120.0) -> None:
    (barrier / f"{os.getpid()}.ready").touch()
    deadline = time.monotonic() + timeout_s
    while not (barrier / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no {barrier / 'go'} after {timeout_s:g} s")
        time.sleep(0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--trace", default="all")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--barrier", type=Path, default=None)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--export-interval", type=float, default=0.2)
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # steadier on a shared machine: no op waits for a second thread
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.compile:
        model = torch.compile(model, backend="eager")  # type: ignore[assignment]
    loader = torch.utils.data.DataLoader(
        SlowData(args.batch * args.steps, args.delay),
        batch_size=args.batch,
        num_workers=args.workers,
    )
    otel_train.instrument(model, optimizer=opt, dataloader=loader, prometheus=False,
                          console_every=0, run_dir=args.run_dir, trace_steps=args.trace,
                          metric_export_interval=args.export_interval)  # fmt: skip
    if args.barrier is not None:
        wait_for_the_others(args.barrier)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    assert otel_train.shutdown()


if __name__ == "__main__":
    main()
