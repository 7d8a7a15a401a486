"""Memory and shutdown time of a run whose Collector is down the whole time.

Trains a small model (forward, backward, SGD as phases, every step traced) with OTLP
pointed at a loopback port where nothing listens. Prints the RSS (the training
process's plus its sidecar's) after a warm-up and after many thousand more steps,
otel-train's drop counts, and how long
``shutdown()`` took against its ``shutdown_timeout``, as one JSON line.

``--hung``: the endpoint is a loopback socket that listens and never answers (the kernel
completes the connections, nothing reads them: an exporter waits out its own timeout),
instead of a port where nothing listens.

``--seconds N``: a soak; after the warm-up, train for N seconds instead of ``--steps``,
reading both processes' RSS every ``--sample-every`` seconds (from /proc, no flush, so
the loop does not pause); the readings and their maximum go into the JSON line, and each
is printed to stderr as it is taken.

The run record goes to a temporary directory; its last metric snapshot gives the steps
recorded and ``otel_train.dropped`` by reason, so the JSON line says how many of the steps
run are accounted for (recorded + dropped as ``queue_full``, ``sidecar``, ``shutdown``).
``--cpu N``: this process (and so its sidecar, which inherits it) on CPU N alone, as
``taskset -c N`` does.

Usage: python benchmarks/collector_down.py [--warmup 2000] [--steps 20000] [--timeout 5]
       [--hung] [--seconds 600 [--sample-every 60]] [--cpu 0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch

STEP_DROPS = ("queue_full", "sidecar", "shutdown")  # reasons that drop whole steps


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


def recorded(run_dir: Path) -> dict:
    """The run record's last snapshot: steps recorded and drops by reason."""
    from otel_train import contract as c
    from otel_train.runs.record_data import load_run

    (rank,) = load_run(next(run_dir.iterdir()), max_traces=1).ranks  # (its metrics)
    last = rank.snapshots[-1].values
    dropped = {
        dict(attrs)[c.A_REASON]: int(n)
        for (name, attrs), n in last.items()
        if name == c.DROPPED.name
    }
    return {"recorded": int(last.get((c.STEPS.name, ()), 0)), "dropped": dropped}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--hung", action="store_true", help="an endpoint that never answers")
    ap.add_argument("--seconds", type=float, default=0.0, help="soak this long instead of --steps")
    ap.add_argument("--sample-every", type=float, default=60.0, help="RSS reading interval (s)")
    ap.add_argument("--cpu", type=int, default=None, help="run on this CPU alone (and the sidecar)")
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    run_dir = Path(tempfile.mkdtemp(prefix="collector-down-"))
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
        run_dir=str(run_dir),
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

    def soak(seconds: float, every: float) -> tuple[int, list[dict]]:
        """Train for ``seconds``, reading RSS every ``every`` seconds; returns the steps
        run and the readings."""
        side_pid = session.feeder.proc.pid if session.feeder is not None else None
        samples: list[dict] = []
        steps = 0
        start = time.perf_counter()
        due = start
        while True:
            now = time.perf_counter()
            if now >= due:
                side = rss_bytes(side_pid) if side_pid is not None else 0
                sample = {
                    "t_s": round(now - start, 1),
                    "steps": steps,
                    "sidecar_mib": round(side / 2**20, 2),
                    "training_mib": round(rss_bytes() / 2**20, 1),
                }
                samples.append(sample)
                print(json.dumps(sample), file=sys.stderr, flush=True)
                due += every
            if now - start >= seconds:
                return steps, samples
            run(200)
            steps += 200

    run(args.warmup)
    time.sleep(1.0)  # let the worker and exporters settle into the outage
    own0, side0 = rss()
    rss0 = own0 + side0
    samples: list[dict] = []
    t_soak = time.perf_counter()
    if args.seconds > 0:
        args.steps, samples = soak(args.seconds, args.sample_every)
    else:
        run(args.steps)
    rate = args.steps / (time.perf_counter() - t_soak)
    time.sleep(1.0)
    own1, side1 = rss()
    rss1 = own1 + side1
    elapsed = time.perf_counter() - t0
    drops = session.export_drops()
    drops["queue_full"] = session.recorder.dropped_steps
    t1 = time.monotonic()
    ok = otel_train.shutdown()
    shutdown_s = time.monotonic() - t1
    record = recorded(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_steps = args.warmup + args.steps
    step_drops = sum(n for r, n in record["dropped"].items() if r in STEP_DROPS)
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
                "steps_per_s": round(rate),
                "rss_sidecar_after_warmup_mib": round(side0 / 2**20, 2),
                "rss_sidecar_at_end_mib": round(side1 / 2**20, 2),
                "rss_training_at_end_mib": round(own1 / 2**20, 1),
                "sidecar_max_sampled_mib": max((x["sidecar_mib"] for x in samples), default=None),
                "samples": samples,
                "dropped": drops,
                "record": record,
                "steps_run": run_steps,
                "steps_accounted": record["recorded"] + step_drops,
                "cpu": args.cpu,
                "shutdown_timeout_s": args.timeout,
                "shutdown_s": round(shutdown_s, 3),
                "shutdown_in_time": ok,
                "endpoint": "hung" if held is not None else "refused",
            }
        )
    )


if __name__ == "__main__":
    main()
