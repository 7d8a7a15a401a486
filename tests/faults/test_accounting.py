"""Steps accounted for when the sidecar cannot keep up: every step the loop ran is in the
run record's step count or in otel_train.dropped, the summary says what was dropped, and
``shutdown()`` returns False.

The sidecar is stopped (SIGSTOP, as a descheduled or swapped-out process would be) for
most of a fast loop and let go again shortly before the end: its backlog is then more
than it can apply by the shutdown deadline, and what it cannot apply it counts
(dropped{reason="shutdown"}) instead of being killed with it uncounted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratch import job_env

from otel_train import contract as c
from otel_train.runs.record_data import load_run

JOB = textwrap.dedent("""
    import json, os, signal, sys
    import torch, otel_train
    from otel_train import session

    steps, stop_at, go_at, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    model = torch.nn.Linear(8, 2)
    x = torch.randn(4, 8)
    otel_train.configure(prometheus=False, console_every=0, run_dir=out, shutdown_timeout=4)
    sidecar = session.current().feeder.process.pid
    for i in range(steps):
        if i == stop_at:
            os.kill(sidecar, signal.SIGSTOP)
        if i == go_at:
            os.kill(sidecar, signal.SIGCONT)
        with otel_train.step(samples=4):
            with otel_train.phase("forward"):
                loss = model(x).sum()
            with otel_train.phase("backward"):
                loss.backward()
    with open(f"/proc/{sidecar}/statm") as f:  # (resident pages: its backlog held)
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    print(json.dumps({"sidecar_rss": rss, "shutdown": otel_train.shutdown()}))
""")
STEPS = 20_000


@dataclass
class Finished:
    """A job's last printed line, its stderr, and its run record's step count and drops."""

    result: dict[str, Any]
    stderr: str
    recorded: float
    dropped: dict[str, float]

    @property
    def steps_dropped(self) -> float:
        return sum(n for r, n in self.dropped.items() if r in ("queue_full", "sidecar", "shutdown"))


def _run_job(tmp_path: Path, job: str, *args: str) -> Finished:
    script = tmp_path / "job.py"
    script.write_text(job)
    runs = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, str(script), *args, str(runs)],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (rank,) = load_run(next(runs.iterdir())).ranks
    last = rank.snapshots[-1].values
    dropped = {
        dict(attrs)[c.A_REASON]: n for (name, attrs), n in last.items() if name == c.DROPPED.name
    }
    result = json.loads(done.stdout.splitlines()[-1])
    return Finished(result, done.stderr, last[(c.STEPS.name, ())], dropped)


def test_a_sidecar_that_falls_behind_counts_what_it_drops(tmp_path: Path) -> None:
    job = _run_job(tmp_path, JOB, str(STEPS), "2000", str(STEPS - 8000))
    result, recorded, dropped = job.result, job.recorded, job.dropped
    assert result["shutdown"] is False
    assert result["sidecar_rss"] < 64 << 20  # issue 37's bound for the sidecar's memory
    summary = re.search(r"run summary: (\d+) steps", job.stderr)
    assert summary is not None, job.stderr[-3000:]
    said = re.search(r"telemetry dropped \(not in the figures above\): (.*) \(reasons", job.stderr)
    assert said is not None, job.stderr[-3000:]
    assert recorded == int(summary.group(1))
    assert said.group(1) == ", ".join(f"{int(n):,} {r}" for r, n in sorted(dropped.items()))
    steps_dropped = job.steps_dropped
    print(f"\nrecorded {recorded:.0f} + dropped {dropped} of {STEPS} steps; sidecar RSS "
          f"{result['sidecar_rss'] / 2**20:.1f} MiB")  # fmt: skip
    # Every step once: recorded, or counted as dropped (the double counts across a raw
    # session's end and at the sidecar's held-steps bound are fixed: 7f27f77, 98a837c).
    assert recorded + steps_dropped == STEPS


CATCH_UP_JOB = textwrap.dedent("""
    import json, os, signal, sys, threading
    import torch, otel_train
    from otel_train import session

    steps, out = int(sys.argv[1]), sys.argv[2]
    model = torch.nn.Linear(8, 2)
    x = torch.randn(4, 8)
    otel_train.configure(prometheus=False, console_every=0, run_dir=out, shutdown_timeout=5)
    sess = session.current()
    feeder = sess.feeder
    sidecar = feeder.process.pid
    for i in range(steps):
        if i == 100:
            os.kill(sidecar, signal.SIGSTOP)
        with otel_train.step(samples=4):
            with otel_train.phase(f"phase_{i}"):  # (a new step shape every step)
                loss = model(x).sum()
            with otel_train.phase("backward"):
                loss.backward()
    # A state request replays the ring here (the sidecar never read it) while the
    # feeder's thread pumps, as it does every tick it finds the training thread idle.
    done = threading.Event()
    def pumping():
        while not done.is_set():
            feeder.pump(idle=True)
    thread = threading.Thread(target=pumping)
    thread.start()
    sess.recorder.settle()
    done.set()
    thread.join()
    os.kill(sidecar, signal.SIGCONT)
    print(json.dumps({"caught_up": feeder.handover.caught_up, "shutdown": otel_train.shutdown()}))
""")
CATCH_UP_STEPS = 3_000


def test_a_raw_sessions_end_replayed_while_the_feeder_pumps_counts_each_step_once(
    tmp_path: Path,
) -> None:
    """A new phase name every step, the sidecar behind for most of the loop: the raw
    session's end is replayed here (thousands of steps the sidecar's replica has) while
    the feeder's thread pumps. Each step is in the record or in a drop count, once (a
    pump took the replayed steps and handed them on again: ~360 counted twice)."""
    job = _run_job(tmp_path, CATCH_UP_JOB, str(CATCH_UP_STEPS))
    assert job.result["caught_up"] > 0  # (the end was replayed here)
    recorded, dropped = job.recorded, job.dropped
    print(f"\nrecorded {recorded:.0f} + dropped {dropped} of {CATCH_UP_STEPS} steps")
    assert recorded + job.steps_dropped == CATCH_UP_STEPS
    assert job.result["shutdown"] is (not dropped)
    summary = re.search(r"run summary: ([\d,]+) steps", job.stderr)
    assert summary is not None, job.stderr[-3000:]
    assert int(summary.group(1).replace(",", "")) == recorded


# The same job with the device timed (the CUDA stand-in installed before anything else):
# its boundaries go out in stamped raw sessions, whose events the feeder's thread resolves.
STANDIN = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {str(Path(__file__).parents[1] / "unit")!r})
    import cuda_standin, pytest
    standin = cuda_standin.installed(pytest.MonkeyPatch())
    standin.__enter__()
""")


def test_a_gpu_jobs_stamped_sessions_count_what_they_drop(tmp_path: Path) -> None:
    """A GPU-shaped job (the stand-in runtime) whose sidecar falls behind: the ring fills
    with stamped slots the sidecar does not read, the training process catches up with
    the table's events, and every step is in the record or in a drop count, once."""
    job_text = STANDIN + JOB.replace(
        'print(json.dumps({"sidecar_rss"',
        'print(json.dumps({"stamped": session.current().feeder.handover.stamped, "sidecar_rss"',
    )
    job = _run_job(tmp_path, job_text, str(STEPS), "2000", str(STEPS - 8000))
    recorded, dropped = job.recorded, job.dropped
    print(f"\nrecorded {recorded:.0f} + dropped {dropped} of {STEPS} steps")
    assert job.result["stamped"] is True  # (its sessions carried stamps)
    assert recorded + job.steps_dropped == STEPS
    assert job.result["shutdown"] is (not dropped)
