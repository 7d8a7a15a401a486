"""On a CUDA device: what otel-train costs a GPU training loop, and what its device times say.

Prints, side by side in one run:
1. Wall time per step of a small transformer block stack (bf16 autocast) for N steps:
   plain, instrumented by otel-train (defaults: sampled traces, device timing, per-phase
   memory), and instrumented with one OTel SDK span per phase; no per-step sync anywhere,
   one ``torch.cuda.synchronize()`` at the end of each timed run.
2. Mean time per phase on each clock: the device's (CUDA events, the default) from the
   instrumented runs, and the host's from the same runs with ``device_timing="off"``
   (a phase timed on the device has no host series: the host's is the time to launch
   its kernels, not to run them, which is why the device's is the default).

Usage: python benchmarks/gpu_timing.py [--steps 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

import otel_train
from otel_train import contract as c
from otel_train import session
from otel_train.export.setup import in_memory_meter_provider

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from overhead import sdk_tracer_provider

WARMUP_STEPS = 10  # untimed steps of each variant, after instrument()


def make_job(dim: int, layers: int, batch: int, seq: int) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        dim, nhead=16, dim_feedforward=4 * dim, batch_first=True, dropout=0.0
    )
    model = torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    data = torch.randn(32, batch, seq, dim, pin_memory=True)
    return model, opt, data


def run(model: Any, opt: Any, data: Any, steps: int, tracer: Any = None) -> None:
    for i in range(steps):
        x_cpu = data[i % data.shape[0]]
        if tracer is None:
            x = x_cpu.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            continue
        with tracer.start_as_current_span("step"):
            with tracer.start_as_current_span("data"):
                x = x_cpu.cuda(non_blocking=True)
            with (
                tracer.start_as_current_span("forward"),
                torch.autocast("cuda", dtype=torch.bfloat16),
            ):
                loss = model(x).float().pow(2).mean()
            with tracer.start_as_current_span("backward"):
                opt.zero_grad(set_to_none=True)
                loss.backward()
            with tracer.start_as_current_span("optimizer"):
                opt.step()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_timing: no CUDA device; nothing to measure")
        return
    model, opt, data = make_job(args.dim, args.layers, 8, 512)
    run(model, opt, data, 20)
    torch.cuda.synchronize()
    span_tp = sdk_tracer_provider()
    span_tracer = span_tp.get_tracer("bench")
    ours_tp = sdk_tracer_provider()
    walls: dict[str, list[float]] = {
        "plain": [], "otel-train": [], "otel-train, host clock": [], "span per phase": []
    }  # fmt: skip
    phase_dev: dict[str, list[float]] = {}
    phase_host: dict[str, list[float]] = {}
    for r in range(args.rounds):
        k = r % len(walls)
        for name in list(walls)[k:] + list(walls)[:k]:
            inst = None
            if name.startswith("otel-train"):
                mp, _ = in_memory_meter_provider()
                inst = otel_train.instrument(
                    model, optimizer=opt, tracer_provider=ours_tp, meter_provider=mp,
                    console="off", device_timing="off" if "host" in name else "auto",
                )  # fmt: skip
            tracer = span_tracer if name == "span per phase" else None
            # Steady state: each variant's first steps untimed (otel-train counts the
            # FLOPs of its first step under a dispatch mode, a one-off per run that 200
            # steps would not amortise; the GPU review saw it inflate this figure).
            run(model, opt, data, WARMUP_STEPS, tracer)
            torch.cuda.synchronize()
            t = time.perf_counter()
            run(model, opt, data, args.steps, tracer)
            torch.cuda.synchronize()
            walls[name].append((time.perf_counter() - t) / args.steps * 1e3)
            if inst is not None:
                sess = session.current()
                assert sess is not None
                deadline = time.monotonic() + 10
                while sess.recorder.has_work() and time.monotonic() < deadline:
                    sess.worker.process()
                    time.sleep(0.01)
                for attrs, h in sess.worker.phases.histograms.items():
                    labels = dict(attrs)  # ((clock, ...), (phase, ...)); collectives: no phase
                    nm, clock = labels.get(c.A_PHASE), labels.get(c.A_CLOCK)
                    if h.count and nm is not None:
                        (phase_dev if clock == "device" else phase_host).setdefault(nm, []).append(
                            h.sum / h.count * 1e3
                        )
                print(f"round {r}: CUDA events created {sess.recorder.events.created}")
                otel_train.shutdown()
    base = statistics.median(walls["plain"])
    print(
        f"\nGPU {torch.cuda.get_device_name(0)}, torch {torch.__version__}; "
        f"{args.layers}x TransformerEncoderLayer d={args.dim}, batch 8 x 512, bf16 autocast"
    )
    print(f"{'variant':<18}{'ms/step':>10}{'delta':>10}{'%':>8}")
    for name, values in walls.items():
        m = statistics.median(values)
        print(f"{name:<18}{m:>10.3f}{m - base:>10.3f}{100 * (m - base) / base:>7.2f}%")
    print("\nmean phase time (ms), by clock")
    for nm in sorted(set(phase_dev) | set(phase_host)):
        d = statistics.median(phase_dev[nm]) if nm in phase_dev else float("nan")
        h = statistics.median(phase_host[nm]) if nm in phase_host else float("nan")
        print(f"{nm:<12} device {d:>9.3f}   host {h:>9.3f}")
    span_tp.shutdown()
    ours_tp.shutdown()


if __name__ == "__main__":
    main()
