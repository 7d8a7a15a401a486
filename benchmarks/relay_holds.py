"""How long the relay holds the GIL in the training process, one hold at a time.

With the application's own providers (``tail.py``'s ``app`` variant) the sidecar sends
back the traced steps and the metrics, and a thread of the training process hands them
to the application's SDK (``otel_train/handover/relay_in.py``). While it runs, the
training thread cannot take the GIL back after a call into torch: a hold of this
thread's is a wait of the training thread's, if the two meet. This trains ``tail.py``'s
MLP with the application's providers (OTLP/HTTP into the endpoint of the environment:
run ``benchmarks/otlp_sink.py``) and measures on the relay thread's CPU clock
(``time.thread_time_ns``) each of its pieces by kind: ``read`` (the pipe read and, when
one arrived, a frame unpickled), ``frame`` (a frame unpickled), ``trace`` (a step's trace
begun), ``span`` (one span started or ended); ``settle`` is the metrics unpickled when
the application's meter reads them, ``app_export`` the application's own span exporter
on its own thread (the SDK's, not otel-train's). A CPU clock over our own code is what
this 2-core VM can decide; the steps' wall times are printed beside it for reference
only. Nothing is asserted; one JSON line per run.

Usage: OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4399 \\
       python benchmarks/relay_holds.py [--steps 10000] [--warmup 2000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _timed(cls: Any, name: str, kind: Any, into: dict[str, list[int]]) -> None:
    """Time every call of ``cls.name`` into ``into[kind(self)]`` on the calling thread's
    clock."""
    fn = getattr(cls, name)
    tt = time.thread_time_ns

    def wrapped(self: Any, *a: Any) -> Any:
        key = kind(self)
        t = tt()
        try:
            return fn(self, *a)
        finally:
            into.setdefault(key, []).append(tt() - t)

    setattr(cls, name, wrapped)


def _piece_kind(relay: Any) -> str:
    if relay._trace is not None:
        return "span"
    if relay._frames.unread:
        return "frame"
    return "trace" if relay._waiting else "read"


def _figures(values: list[int]) -> dict[str, Any]:
    v = sorted(values)
    if not v:
        return {"n": 0}
    at = lambda q: round(v[int(q * (len(v) - 1))] / 1e3, 1)  # noqa: E731
    return {"n": len(v), "p50_us": at(0.5), "p99_us": at(0.99), "max_us": at(1.0),
            "total_ms": round(sum(v) / 1e6, 2)}  # fmt: skip


def run_once(steps: int, warmup: int) -> dict[str, Any]:
    import tail
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from otel_train.handover import relay_in

    holds: dict[str, list[int]] = {}
    _timed(relay_in.RelayIn, "_piece", _piece_kind, holds)
    _timed(relay_in.RelayMirror, "_settle", lambda _: "settle", holds)
    _timed(OTLPSpanExporter, "export", lambda _: "app_export", holds)
    res = tail.one("app", steps, warmup, 3.0)
    d = sorted(res["durations"])
    out: dict[str, Any] = {k: _figures(v) for k, v in sorted(holds.items())}
    out["step_wall_us"] = {q: round(d[int(f * (len(d) - 1))] / 1e3, 1)
                           for q, f in (("p50", 0.5), ("p99.9", 0.999), ("max", 1.0))}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--warmup", type=int, default=2_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        ap.error("set OTEL_EXPORTER_OTLP_ENDPOINT (benchmarks/otlp_sink.py serves one)")
    if args.one:
        print(json.dumps(run_once(args.steps, args.warmup)))
        return
    for _ in range(args.runs):  # (each run a fresh process, as a training job is)
        cmd = [sys.executable, __file__, "--one", "--steps", str(args.steps),
               "--warmup", str(args.warmup)]  # fmt: skip
        env = dict(os.environ, OTEL_TRAIN_CONSOLE="off", OTEL_EXPORTER_PROMETHEUS_PORT="0")
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
        print(done.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
