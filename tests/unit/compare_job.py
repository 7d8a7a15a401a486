"""A small instrumented run for the compare and verdict tests: a tiny model fed by a
dataset that sleeps ``--delay`` seconds per sample (a slow input pipeline).

    python compare_job.py RUN_DIR [--delay S] [--steps N] [--trace all|sampled] [--batch N]
"""

from __future__ import annotations

import argparse
import time

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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--trace", default="all")
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # steadier on a shared machine: no op waits for a second thread
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(
        SlowData(args.batch * args.steps, args.delay), batch_size=args.batch
    )
    otel_train.instrument(model, optimizer=opt, dataloader=loader, prometheus=False,
                          console_every=0, run_dir=args.run_dir, trace_steps=args.trace,
                          metric_export_interval=0.2)  # fmt: skip
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    assert otel_train.shutdown()


if __name__ == "__main__":
    main()
