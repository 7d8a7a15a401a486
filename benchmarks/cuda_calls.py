"""On a CUDA device: what each call the recorder makes at a boundary costs the calling
thread, in microseconds of its CPU clock (``time.thread_time_ns``), median and p99 over
many calls, warm and right after a burst of kernel launches (the cold case a hook
meets).

The calls: recording a pooled timing event on the current stream (``Event.record``),
reading the allocator's statistics (``torch._C._cuda_memoryStats``, a dict of every
statistic, taken at every phase boundary for per-phase peaks) and resetting its peaks,
``torch.cuda.is_initialized()`` (the CUDA watch), and an event's ``query()`` (what the
readers poll). They decide what keeping the state machine on the training thread costs
a GPU job besides the state machine itself (docs/rationale.md, "Where the work runs").

Usage: python benchmarks/cuda_calls.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def _measure(call: Callable[[], Any], calls: int, before: Callable[[], Any] | None) -> list[float]:
    out = []
    clock = time.thread_time_ns
    for _ in range(calls):
        if before is not None:
            before()
        t0 = clock()
        call()
        out.append((clock() - t0) / 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_calls: no CUDA device; nothing to measure")
        return
    device = torch.cuda.current_device()
    a = torch.randn(256, 256, device="cuda")
    events = [torch.cuda.Event(enable_timing=True) for _ in range(args.calls)]
    pool = iter(events * 4)
    done = torch.cuda.Event()
    done.record()
    torch.cuda.synchronize()

    def launches() -> None:  # (what a step does before its hook: kernels queued)
        for _ in range(20):
            a.mul_(1.0)

    stats = getattr(torch._C, "_cuda_memoryStats")  # noqa: B009
    reset = getattr(torch._C, "_cuda_resetPeakMemoryStats")  # noqa: B009
    calls: dict[str, Callable[[], Any]] = {
        "Event.record (pooled)": lambda: next(pool).record(),
        "_cuda_memoryStats": lambda: stats(device),
        "_cuda_resetPeakMemoryStats": lambda: reset(device),
        "torch.cuda.is_initialized": torch.cuda.is_initialized,
        "Event.query (completed)": done.query,
    }
    print(f"GPU {torch.cuda.get_device_name(device)}, torch {torch.__version__}; "
          f"{args.calls} calls each, us of the calling thread's CPU")  # fmt: skip
    print(f"{'call':<30}{'warm p50':>10}{'warm p99':>10}{'cold p50':>10}{'cold p99':>10}")
    for name, call in calls.items():
        warm = sorted(_measure(call, args.calls, None))
        cold = sorted(_measure(call, args.calls // 4, launches))
        torch.cuda.synchronize()

        def p99(v: list[float]) -> float:
            return v[min(len(v) - 1, int(0.99 * len(v)))]

        print(f"{name:<30}{statistics.median(warm):>10.2f}{p99(warm):>10.2f}"
              f"{statistics.median(cold):>10.2f}{p99(cold):>10.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
