"""A run stopped by a signal still delivers what it buffered, against the real Collector.

Spans and metrics are exported only at the flush here (a 60 s batch delay and export
interval), so every step span and the final step count reaching the Collector shows
the signal path flushed them.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from collector_helpers import job_env, metric_points, step_indices, wait_for

TRAIN = textwrap.dedent("""
    import signal, sys, time
    from pathlib import Path
    import torch, otel_train

    ctl = Path(sys.argv[1])
    if sys.argv[2] == "user-handler":
        def stop(signum, frame):
            (ctl / "user-handler-ran").write_text(str(signum))
            sys.exit(3)
        signal.signal(signal.SIGTERM, stop)
    model = torch.nn.Linear(8, 2)
    x = torch.randn(4, 8)
    otel_train.configure()
    steps = 0
    while True:
        with otel_train.step(samples=4):
            with otel_train.phase("forward"):
                model(x).sum().backward()
        steps += 1
        (ctl / "steps.tmp").write_text(str(steps)); (ctl / "steps.tmp").rename(ctl / "steps")
        time.sleep(0.01)
""")


@pytest.mark.parametrize(
    ("how", "sig", "returncode"),
    [
        ("default", signal.SIGTERM, -signal.SIGTERM),  # dies by SIGTERM, as without us
        ("user-handler", signal.SIGTERM, 3),  # the user's handler ran and chose the exit
        ("default", signal.SIGINT, -signal.SIGINT),  # KeyboardInterrupt: atexit flushes
    ],
)
def test_a_signalled_run_flushes(
    collector: Any, tmp_path: Path, how: str, sig: int, returncode: int
) -> None:
    collector.start()
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    env = job_env(
        collector.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="60000",
        OTEL_TRAIN_METRIC_EXPORT_INTERVAL="60",
        OTEL_TRAIN_SHUTDOWN_TIMEOUT="5",
    )
    job = subprocess.Popen(
        [sys.executable, str(script), str(ctl), how],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        steps = ctl / "steps"
        wait_for(lambda: steps.exists() and int(steps.read_text() or 0) >= 50, "50 steps")
        time.sleep(0.5)
        sent = time.monotonic()
        job.send_signal(sig)
        _, err = job.communicate(timeout=60)
        print(f"\n{how} {signal.Signals(sig).name}: exited {time.monotonic() - sent:.3f} s after")
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == returncode, err
    if how == "user-handler":
        assert (ctl / "user-handler-ran").read_text() == str(int(sig))
    done = int(steps.read_text())
    # Every finished step (the one cut short may be missing) and the final count arrive.
    indices = wait_for(
        lambda: [i for i in step_indices(collector.output()) if i < done - 1] or None,
        "flushed step spans",
    )
    assert sorted(set(indices)) == list(range(done - 1))
    counts = wait_for(
        lambda: [v for _, v in metric_points(collector.output(), "otel_train.steps")],
        "the flushed step count",
    )
    assert max(counts) >= done - 1
