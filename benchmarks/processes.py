"""What otel-train costs a training loop, one process per run, runs alternated.

``overhead.py`` switches variants inside one process, chunk by chunk. This script runs
each variant in a fresh process instead: a long run, as in training, with otel-train's
worker thread running throughout, and without the switching between chunks. Each
process trains overhead.py's MLP (784-448-448-10, batch 64, one torch thread), warms up
for ``--warmup`` steps, then times ``--steps`` steps and reports its median step. The
variants alternate over ``--rounds`` rounds: plain, otel-train at defaults (console
off), and one OTel SDK span per phase plus one per step.

Each process is placed in memory afresh, so whole runs differ by up to ~100 us per step
on a shared VM. The figures are the median over rounds of each variant's median step and
the median of per-round differences from plain, printed with their spread.

Usage: python benchmarks/processes.py [--rounds 8] [--steps 2000] [--warmup 300]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("plain", "otel-train (default)", "OTel SDK span per phase")


def one(variant: str, steps: int, warmup: int) -> float:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    import overhead as ob

    torch.set_num_threads(1)
    model, opt, loader = ob.make_job(448, 64, 64)
    tracer = None
    if variant == "otel-train (default)":
        import otel_train
        from otel_train.export.setup import in_memory_meter_provider

        mp, _ = in_memory_meter_provider()
        otel_train.configure(tracer_provider=ob.sdk_tracer_provider(), meter_provider=mp,
                             console="off")  # fmt: skip
        otel_train.instrument(model, optimizer=opt, dataloader=loader)
    elif variant == "OTel SDK span per phase":
        tracer = ob.sdk_tracer_provider().get_tracer("bench")

    def run(n: int, ends: list[int] | None = None) -> None:
        if tracer is None:
            ob.plain_steps(model, opt, loader, n, ends)
        else:
            ob.span_steps(model, opt, loader, n, tracer, ends)

    run(warmup)
    ends: list[int] = []
    start = time.perf_counter_ns()
    run(steps, ends)
    durations = [b - a for a, b in zip([start, *ends[:-1]], ends, strict=True)]
    return statistics.median(durations) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(one(args.one, args.steps, args.warmup))
        return
    median: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
        for variant in order:
            out = subprocess.run(
                [sys.executable, __file__, "--one", variant, "--steps", str(args.steps),
                 "--warmup", str(args.warmup)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            median[variant].append(float(out.stdout.split()[-1]))
    base = median["plain"]
    print(f"{args.rounds} rounds of one process per variant, {args.steps} timed steps each "
          "(median step, us)")  # fmt: skip
    print(f"{'variant':<28}{'median':>9}{'delta':>9}{'% of step':>11}  per-round deltas")
    deltas = {}
    for variant, values in median.items():
        per_round = [v - b for v, b in zip(values, base, strict=True)]
        d = deltas[variant] = statistics.median(per_round)
        m = statistics.median(base)
        print(f"{variant:<28}{statistics.median(values):>9.1f}{d:>9.1f}{100 * d / m:>10.2f}%  "
              + " ".join(f"{x:+.0f}" for x in per_round))  # fmt: skip
    spans = deltas["OTel SDK span per phase"]
    if spans > 0:
        print(f"ratio otel-train / span per phase: {deltas['otel-train (default)'] / spans:.3f}")


if __name__ == "__main__":
    main()
