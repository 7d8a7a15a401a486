"""The training thread's CPU time in otel-train, step by step: hooks, pumps, hand-over.

The tail of a step is what a collective waits for, and otel-train's own work on the
training thread is what can put a lump in it: the hooks (each logs a boundary: a tuple
appended to the log, or a slot written into the shared-memory ring), and the pumps of
the sidecar hand-over (``handover/feeder.py``: handing the log or the ring's position on,
sometimes reading the sidecar's reports, sending counters, writing the pipe). This
trains the MLP of ``tail.py`` (64-256-64, batch 32, one torch thread) instrumented at
defaults with otel-train's own SDK and measures, on the training thread's CPU clock
(``time.thread_time_ns``), every call the plain-loop adapter's hooks make into the
recorder (a timing proxy stands in for it; what a hook does around that call is not
counted) and every pump on the training thread outside them; right before each recorder
call it times an empty call the same way, whose per-step sums are this machine's noise
floor (``floor``: a virtual CPU's clock jumps by tens of microseconds now and then).
Pumps on the feeder's own thread are not the training thread's and are left out. Parts
are given too: the training thread's pumps by kind (the raw hand-over, the counters
delivery, the control read, the pipe write). A CPU clock over a few microseconds of our
own code is far less noisy here than a step's wall time (``tail.py``'s ``plain-again``
shows that noise). The proxy's own clock reads are inside what it measures:
``probe_us_per_call`` is their cost (an empty call timed the same way), about seven
calls a step. Nothing is asserted; it prints one JSON line per run.

Usage: python benchmarks/pump_cpu.py [--steps 10000] [--warmup 2000] [--runs 2]
       [--device cuda]
       (set OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_TRAIN_TRACE_STEPS=all for otlp-all;
       OTEL_TRAIN_MEMORY=false for a GPU job without per-phase memory figures)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

PARTS = {"raw": "_pump_raw", "delivery": "_send_delivery", "control": "_read_control"}


def _timed(obj: Any, attr: str, into: list[int], depth: list[int] | None = None) -> None:
    """Time ``obj.attr`` into ``into`` when called on this thread (and, with ``depth``,
    outside a call the proxy timed already)."""
    fn = getattr(obj, attr)
    tt = time.thread_time_ns
    main = threading.get_ident()

    def wrapped(*a: Any, **k: Any) -> Any:
        if threading.get_ident() != main or (depth is not None and depth[0]):
            return fn(*a, **k)
        t = tt()
        try:
            return fn(*a, **k)
        finally:
            into[0] += tt() - t

    setattr(obj, attr, wrapped)


FLOOR = [0]  # the noise floor's sum: see TimedRecorder


def _empty(b: Any) -> None:
    pass


class TimedRecorder:
    """Stands in for the recorder in the adapter's hooks: each call into it timed on the
    thread's CPU clock. The recorder's method is looked up at every call (a raw session
    swaps its ``transition`` for the ring's writer); the two every step makes are written
    out, so that the proxy allocates nothing per call (an allocation here could start a
    garbage collection inside the measured interval that our code did not cause)."""

    def __init__(self, rec: Any, into: list[int], depth: list[int]) -> None:
        object.__setattr__(self, "_rec", rec)
        object.__setattr__(self, "_into", into)
        object.__setattr__(self, "_depth", depth)

    def transition(self, b: Any) -> None:
        depth, tt = self._depth, time.thread_time_ns
        depth[0] += 1
        t = tt()
        _empty(b)  # (the noise floor: the same clock reads around a call of nothing)
        t1 = tt()
        try:
            self._rec.transition(b)
        finally:
            self._into[0] += tt() - t1
            FLOOR[0] += t1 - t
            depth[0] -= 1

    def counted_transition(self, b: Any, s: Any, k: Any, p: Any, t0: int = 0) -> None:
        depth, tt = self._depth, time.thread_time_ns
        depth[0] += 1
        t = tt()
        _empty(b)
        t1 = tt()
        try:
            self._rec.counted_transition(b, s, k, p, t0)
        finally:
            self._into[0] += tt() - t1
            FLOOR[0] += t1 - t
            depth[0] -= 1

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._rec, name)
        if not callable(value):
            return value
        into, depth, tt = self._into, self._depth, time.thread_time_ns

        def timed(*a: Any, **k: Any) -> Any:
            depth[0] += 1
            t = tt()
            try:
                return value(*a, **k)
            finally:
                into[0] += tt() - t
                depth[0] -= 1

        return timed

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._rec, name, value)


def _probe_ns(rounds: int = 20_000) -> float:
    """The proxy's own cost per call: an empty call timed the same way."""
    into, depth = [0], [0]
    probe = TimedRecorder(type("Empty", (), {"transition": lambda self, b: None})(), into, depth)
    for _ in range(rounds):
        probe.transition(None)
    return into[0] / rounds


def one(steps: int, warmup: int, device: str = "cpu") -> dict[str, Any]:
    import torch
    from tail import mlp

    import otel_train

    model, opt, loader = mlp()
    model.to(device)  # (on "cuda": CUDA in use before instrument(), as in a GPU job)
    otel_train.instrument(model, optimizer=opt, dataloader=loader)
    session = otel_train.session.current()
    feeder = getattr(session, "feeder", None)
    if feeder is None:
        raise SystemExit("no sidecar: run with otel-train's own SDK (no providers)")
    total, depth = [0], [0]
    model.forward.adapter.rec = TimedRecorder(session.recorder, total, depth)
    _timed(feeder, "_pump", total, depth)
    parts = {k: [0] for k in (*PARTS, "write")}
    for key, attr in PARTS.items():
        _timed(feeder, attr, parts[key])
    _timed(feeder.process, "write", parts["write"])
    per_step: list[int] = []
    floor: list[int] = []
    done = 0
    while done < steps + warmup:
        for x, y in loader:
            if device != "cpu":
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            before, floor0 = total[0], FLOOR[0]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if done >= warmup:
                per_step.append(total[0] - before)
                floor.append(FLOOR[0] - floor0)
            done += 1
            if done >= steps + warmup:
                break
    handover = feeder.handover
    ring = getattr(handover, "ring", None)  # (before the ring: the log's tuples, pickled)
    writer = "none" if ring is None else "C" if ring.native else "Python"
    left = handover.left
    otel_train.shutdown()
    ordered, floor_ordered = sorted(per_step), sorted(floor)

    def q(p: float, values: list[int] = ordered) -> float:
        return values[min(len(values) - 1, int(p * len(values)))] / 1e3

    return {
        "device": device,
        "steps": len(per_step),
        "us_per_step_mean": sum(per_step) / len(per_step) / 1e3,
        "p99_us": q(0.99),
        "p99.9_us": q(0.999),
        "max_us": ordered[-1] / 1e3,
        "steps_over_30_us": sum(v > 30_000 for v in per_step),
        "steps_over_100_us": sum(v > 100_000 for v in per_step),
        "parts_ms": {k: round(v[0] / 1e6, 1) for k, v in parts.items()},
        "probe_us_per_call": round(_probe_ns() / 1e3, 3),
        # The same clock reads around an empty call just before each recorder call,
        # summed per step: what this machine adds to a few hundred nanoseconds of code.
        "floor": {
            "mean_us": sum(floor) / len(floor) / 1e3,
            "p99_us": q(0.99, floor_ordered),
            "p99.9_us": q(0.999, floor_ordered),
            "max_us": floor_ordered[-1] / 1e3,
        },
        "ring_writer": writer,
        "raw_sessions_left": left,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--warmup", type=int, default=2_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="where the MLP trains: cpu, or cuda")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.steps, args.warmup, args.device)))
        return
    env = dict(os.environ, OTEL_TRAIN_CONSOLE="off", OTEL_EXPORTER_PROMETHEUS_PORT="0")
    for _ in range(args.runs):  # each run a fresh process, as a job is
        out = subprocess.run(
            [sys.executable, __file__, "--one", "--steps", str(args.steps),
             "--warmup", str(args.warmup), "--device", args.device],
            check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        print(out.stdout.splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
