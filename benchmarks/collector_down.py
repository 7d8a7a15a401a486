"""Memory and shutdown time of a run whose Collector is down the whole time.

Trains a small model (forward, backward, SGD as phases, every step traced) with OTLP
pointed at a loopback port where nothing listens. Prints the RSS (the training
process's plus its sidecar's) after a warm-up and after many thousand more steps,
otel-train's drop counts, and how long
``shutdown()`` took against its ``shutdown_timeout``, as one JSON line.

``--hung``: the endpoint is a loopback socket that listens and never answers (the kernel
completes the connections, nothing reads them: an exporter waits out its own timeout),
instead of a port where nothing listens.

Usage: python benchmarks/collector_down.py [--warmup 2000] [--steps 20000] [--timeout 5]
       [--hung]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

import torch


def rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def unused_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # closed again: connections are refused


def hung_endpoint() -> tuple[str, socket.socket]:
    """An endpoint that accepts connections in the kernel and never answers; the socket
    must stay open for the run."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1024)
    return f"http://127.0.0.1:{s.getsockname()[1]}", s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--hung", action="store_true", help="an endpoint that never answers")
    args = ap.parse_args()
    held = None
    if args.hung:
        endpoint, held = hung_endpoint()
    else:
        endpoint = unused_endpoint()
    os.environ.setdefault("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    import otel_train

    session = otel_train.configure(
        trace_steps="all",
        console="off",
        prometheus=False,
        metric_export_interval=1.0,
        shutdown_timeout=args.timeout,
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)

    def run(n: int) -> None:
        for _ in range(n):
            with otel_train.step(samples=32):
                with otel_train.phase("forward"):
                    loss = model(x).pow(2).mean()
                with otel_train.phase("backward"):
                    loss.backward()
                with otel_train.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
            otel_train.record(loss=loss.detach())

    t0 = time.perf_counter()

    def rss() -> tuple[int, int]:
        """This process's RSS and the sidecar's (where the span queue lives), if any, once
        the sidecar has taken what was sent (a bounded flush: it answers at its deadline
        with the Collector down). Read from /proc: a flush answered late leaves the
        feeder's figures stale."""
        sidecar = 0
        if session.feeder is not None:
            otel_train.flush(2.0)
            sidecar = rss_bytes(session.feeder.proc.pid)
        return rss_bytes(), sidecar

    run(args.warmup)
    time.sleep(1.0)  # let the worker and exporters settle into the outage
    own0, side0 = rss()
    rss0 = own0 + side0
    run(args.steps)
    time.sleep(1.0)
    own1, side1 = rss()
    rss1 = own1 + side1
    elapsed = time.perf_counter() - t0
    drops = session.export_drops()
    drops["queue_full"] = session.recorder.dropped_steps
    t1 = time.monotonic()
    ok = otel_train.shutdown()
    shutdown_s = time.monotonic() - t1
    print(
        json.dumps(
            {
                "warmup_steps": args.warmup,
                "steps": args.steps,
                "rss_after_warmup_mib": round(rss0 / 2**20, 1),
                "rss_at_end_mib": round(rss1 / 2**20, 1),
                "rss_growth_mib": round((rss1 - rss0) / 2**20, 2),
                "growth_training_mib": round((own1 - own0) / 2**20, 2),
                "growth_sidecar_mib": round((side1 - side0) / 2**20, 2),
                "run_s": round(elapsed, 1),
                "dropped": drops,
                "shutdown_timeout_s": args.timeout,
                "shutdown_s": round(shutdown_s, 3),
                "shutdown_in_time": ok,
                "endpoint": "hung" if held is not None else "refused",
            }
        )
    )


if __name__ == "__main__":
    main()
