"""The training thread's CPU time in the sidecar hand-over, pump by pump.

The tail of a step is what a collective waits for, and a pump (``sidecar/feeder.py``:
the hand-over of the log to the sidecar process, on the training thread) is the one
piece of otel-train's own work there that comes in lumps: most steps do none, every
fourth or so takes the log, and some pumps also read the sidecar's reports, send the
counters or write the pipe. This trains the MLP of ``tail.py`` (64-256-64, batch 32,
one torch thread) instrumented at defaults with otel-train's own SDK, and measures each
step's share of pump work on the training thread's CPU clock (``time.thread_time_ns``
around the feeder's ``_pump``, and around its parts: the raw take, the counters delivery,
the control read, the pipe write). A CPU clock over a few hundred microseconds of our
own code is far less noisy here than a step's wall time (``tail.py``'s ``plain-again``
shows that noise). Nothing is asserted; it prints one JSON line per run.

Usage: python benchmarks/pump_cpu.py [--steps 10000] [--warmup 2000] [--runs 2]
       (set OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_TRAIN_TRACE_STEPS=all for otlp-all)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

PARTS = {"raw": "_pump_raw", "delivery": "_send_delivery", "control": "_read_control"}


def _timed(obj: Any, attr: str, into: list[int]) -> None:
    fn = getattr(obj, attr)
    tt = time.thread_time_ns

    def wrapped(*a: Any, **k: Any) -> Any:
        t = tt()
        try:
            return fn(*a, **k)
        finally:
            into[0] += tt() - t

    setattr(obj, attr, wrapped)


def one(steps: int, warmup: int) -> dict[str, Any]:
    import torch
    from tail import mlp

    import otel_train

    model, opt, loader = mlp()
    otel_train.instrument(model, optimizer=opt, dataloader=loader)
    session = otel_train.session.current()
    feeder = getattr(session, "feeder", None)
    if feeder is None:
        raise SystemExit("no sidecar: run with otel-train's own SDK (no providers)")
    total = [0]
    parts = {k: [0] for k in (*PARTS, "write")}
    _timed(feeder, "_pump", total)
    for key, attr in PARTS.items():
        _timed(feeder, attr, parts[key])
    _timed(feeder.process, "write", parts["write"])
    per_step: list[int] = []
    done = 0
    while done < steps + warmup:
        for x, y in loader:
            before = total[0]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if done >= warmup:
                per_step.append(total[0] - before)
            done += 1
            if done >= steps + warmup:
                break
    otel_train.shutdown()
    ordered = sorted(per_step)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] / 1e3

    return {
        "steps": len(per_step),
        "pump_us_per_step_mean": sum(per_step) / len(per_step) / 1e3,
        "p99_us": q(0.99),
        "p99.9_us": q(0.999),
        "max_us": ordered[-1] / 1e3,
        "steps_over_100_us": sum(v > 100_000 for v in per_step),
        "steps_over_200_us": sum(v > 200_000 for v in per_step),
        "parts_ms": {k: round(v[0] / 1e6, 1) for k, v in parts.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--warmup", type=int, default=2_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.steps, args.warmup)))
        return
    env = dict(os.environ, OTEL_TRAIN_CONSOLE="off", OTEL_EXPORTER_PROMETHEUS_PORT="0")
    for _ in range(args.runs):  # each run a fresh process, as a job is
        out = subprocess.run(
            [sys.executable, __file__, "--one", "--steps", str(args.steps),
             "--warmup", str(args.warmup)],
            check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        print(out.stdout.splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
