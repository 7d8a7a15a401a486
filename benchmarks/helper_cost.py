"""What the sidecar (the helper process) costs: ``instrument()``'s wall time, which waits
for it to start, and its resident memory.

Each round is a fresh training process (imports torch, then otel-train) that instruments
a small model with otel-train's own SDK (no providers passed: the sidecar runs), trains
a few steps and flushes. It reports how long importing otel-train took (its API
included, which loads at first use), how long ``otel_train.instrument()`` took, the
sidecar's resident memory as the kernel counts it (``/proc/PID/status``, VmRSS) and as
the sidecar reports it, and whether the sidecar imported torch. Printed: one line per
round, then the medians.

Usage: python benchmarks/helper_cost.py [--rounds 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys


def vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def one(steps: int) -> dict[str, object]:
    import time

    import torch

    t0 = time.perf_counter()
    import otel_train
    from otel_train import session as session_mod

    instrument = otel_train.instrument  # (the API loads at its first use)
    import_s = time.perf_counter() - t0
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 8, 64), torch.randn(steps * 8, 8))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    t0 = time.perf_counter()
    instrument(model, optimizer=opt, dataloader=loader, console="off", prometheus_port=0,
               run_dir="off")  # fmt: skip
    seconds = time.perf_counter() - t0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    sess = session_mod.current()
    assert sess is not None and sess.feeder is not None, "no sidecar: providers were set"
    t0 = time.perf_counter()
    flushed = otel_train.flush(10.0)
    flush_s = time.perf_counter() - t0
    stats = sess.feeder.stats
    out = {
        "import_s": round(import_s, 3),
        "instrument_s": round(seconds, 3),
        "flushed": flushed,
        "flush_s": round(flush_s, 3),
        "sidecar_vmrss_mib": round(vm_rss(sess.feeder.proc.pid) / 2**20, 1),
        "sidecar_reported_rss_mib": round(int(stats.get("rss_bytes", 0)) / 2**20, 1),
        "sidecar_torch": stats.get("torch_imported"),
        "sidecar_modules": stats.get("modules"),
    }
    otel_train.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.steps)))
        return
    rounds = []
    for _ in range(args.rounds):
        done = subprocess.run([sys.executable, __file__, "--one", "--steps", str(args.steps)],
                              check=True, capture_output=True, text=True)  # fmt: skip
        rounds.append(json.loads(done.stdout.splitlines()[-1]))
        print(json.dumps(rounds[-1]))
    medians = {
        k: statistics.median(float(r[k]) for r in rounds)  # type: ignore[arg-type]
        for k in ("import_s", "instrument_s", "sidecar_vmrss_mib", "sidecar_reported_rss_mib")
    }
    print("median of", args.rounds, "rounds:", json.dumps(medians))


if __name__ == "__main__":
    main()
