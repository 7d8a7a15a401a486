"""A signal that lands inside otel-train's own code on the training thread (here: in a
pump to the sidecar, holding the lock the flush takes) ends the job as it would have
ended anyway, with the summary printed and the run record flushed, within the shutdown
deadline: the handler waits until the thread is back in the user's code.

The job calls ``otel_train.flush()`` every 10 steps (as a loop may at a checkpoint) and
sends the signal to itself from within the pump that flush makes (the sidecar process's
write, on the main thread), so the handler runs there every time, not by chance.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from scratch import job_env

from otel_train import contract as c
from otel_train.runs.record_data import load_run

JOB = textwrap.dedent("""
    import os, signal, sys, threading
    from pathlib import Path
    import torch, otel_train
    from otel_train.handover.process import SidecarProcess

    sig, out = int(sys.argv[1]), Path(sys.argv[2])
    # (a job started in the background inherits SIGINT ignored: a terminal's is not)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    state = {"steps": 0, "sent": False}
    write = SidecarProcess.write

    def write_and_signal(self):
        if (not state["sent"] and state["steps"] >= 20
                and threading.current_thread() is threading.main_thread()):
            state["sent"] = True
            (out / "sent").write_text(str(state["steps"]))
            os.kill(os.getpid(), sig)  # its handler runs here, inside the pump
        return write(self)

    SidecarProcess.write = write_and_signal
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    otel_train.configure(prometheus=False, run_dir=str(out / "runs"), shutdown_timeout=5)
    try:
        for _ in range(3_000):
            with otel_train.step(samples=4):
                with otel_train.phase("forward"):
                    model(x).sum().backward()
                with otel_train.phase("optimizer"):
                    opt.step(); opt.zero_grad()
            state["steps"] += 1
            if state["steps"] % 10 == 0:
                otel_train.flush(timeout=5)  # (a pump on this thread, as at a checkpoint)
    except KeyboardInterrupt:
        (out / "interrupted").write_text(str(state["steps"]))
        raise
    (out / "finished").write_text(str(state["steps"]))  # (the signal did not stop it)
""")


@pytest.mark.parametrize(
    ("sig", "returncode"),
    [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, -signal.SIGINT)],
)
def test_a_signal_inside_a_pump_flushes_and_ends(tmp_path: Path, sig: int, returncode: int) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    job = subprocess.Popen(
        [sys.executable, str(script), str(int(sig)), str(tmp_path)],
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    try:
        out, err = job.communicate(timeout=90)  # (5 s of shutdown deadline; start-up ~10 s)
    except subprocess.TimeoutExpired:
        job.kill()
        out, err = job.communicate()
        pytest.fail(f"the job hung after the signal inside a pump:\n{err[-3000:]}")
    print(f"\n{signal.Signals(sig).name}: ended {time.monotonic() - started:.1f} s after start")
    assert (tmp_path / "sent").exists(), err[-3000:]
    assert job.returncode == returncode, err[-3000:]
    assert not (tmp_path / "finished").exists()
    if sig == signal.SIGINT:  # KeyboardInterrupt, raised in the user's code
        assert (tmp_path / "interrupted").exists(), err[-3000:]
        traceback = err[err.index("Traceback") : err.index("KeyboardInterrupt")]
        ours = re.findall(r'File "[^"]*/otel_train/([^"]+)"', traceback)
        assert set(ours) <= {"signals.py"}, traceback  # (the handler that raised it)
    summary = re.search(r"otel-train run summary: (\d+) steps", out + err)
    assert summary is not None, out + err
    steps = int(summary.group(1))
    assert steps >= int((tmp_path / "sent").read_text())
    (rank,) = load_run(next((tmp_path / "runs").iterdir())).ranks
    assert rank.snapshots, "the run record has no metrics: it was not flushed"
    assert rank.snapshots[-1].values[(c.STEPS.name, ())] == steps
