"""Process memory metrics describe the training process, also where the sidecar
(another process, of a few dozen MiB) exports them (issue 38 item 12)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from scratch import job_env

from otel_train import contract as c
from otel_train.runs.record_data import load_run

JOB = textwrap.dedent("""
    import json, os, resource, sys
    import torch, otel_train
    from otel_train import session

    otel_train.configure(prometheus=False, console_every=0, run_dir=sys.argv[1])
    held = bytearray(200 << 20)  # resident: every page written
    for i in range(0, len(held), 4096):
        held[i] = 1
    model = torch.nn.Linear(8, 2)
    x = torch.randn(4, 8)
    for _ in range(20):
        with otel_train.step(samples=4):
            model(x).sum().backward()
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    sidecar = session.current().feeder is not None
    print(json.dumps({"rss": rss, "sidecar": sidecar, "shutdown": otel_train.shutdown()}))
""")


def test_the_exported_rss_is_the_training_process_s(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    runs = tmp_path / "runs"
    done = subprocess.run([sys.executable, str(script), str(runs)], env=job_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["sidecar"] and result["shutdown"], done.stderr[-3000:]
    (rank,) = load_run(next(runs.iterdir())).ranks
    last = rank.snapshots[-1].values
    rss = last[(c.PROCESS_MEMORY_RSS.name, ())]
    peak = last[(c.PROCESS_MEMORY_PEAK_RSS.name, ())]
    print(f"\ntrainer {result['rss'] / 2**20:.0f} MiB; exported rss {rss / 2**20:.0f} MiB, "
          f"peak {peak / 2**20:.0f} MiB")  # fmt: skip
    assert rss >= 200 << 20
    assert peak >= rss
    assert rss <= result["rss"] * 1.5
