"""A stuck distributed job explains itself: torchrun on the CPU (gloo), into a real Collector.

Each job is DDP plus an explicit ``all_reduce`` every step, instrumented with one call to
``otel_train.instrument`` and ``hang_after=8``; its ranks export over OTLP/HTTP (the sidecar,
otel-train's default) to a Collector on loopback whose debug exporter prints what arrives.
Then:

- one rank sleeps 30 s between two steps (outside any collective): every rank sends an
  ``otel_train.hang`` record within hang_after + 5 s; the sleeping rank's names no
  collective and its stack shows the sleep, the others name the collective they wait in;
  each sends ``otel_train.hang.resolved``; ``otel_train.progress.age`` passes 8 (2 and 4
  ranks);
- a real deadlock (one rank skips one ``all_reduce``; gloo's timeout is short): the records
  name each rank's collective and sequence number, so the mismatch is visible;
- a rank stopped with SIGSTOP: its peers report their hang, its sidecar that the training
  process does not answer; a rank killed with SIGKILL: gloo's survivors fail at once (it
  sees the closed connections), with gloo's error on the failing phase;
- slow steps (2.5 s each) and a 20 s checkpoint region: no hang record.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from collector_helpers import (
    Collector,
    job_env,
    log_records,
    rank_values,
    spans,
    started_collector,
)

from otel_train import contract as c

HANG_AFTER = 8.0
JOB = textwrap.dedent("""
    import datetime, os, signal, sys, time, torch, torch.distributed as dist, otel_train
    from torch.nn.parallel import DistributedDataParallel as DDP

    mode, odd, steps = os.environ["MODE"], int(os.environ["ODD_RANK"]), int(os.environ["STEPS"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ["GLOO_S"])))
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = net if mode == "deadlock" else DDP(net)  # (DDP's buckets would meet a skip)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    otel_train.instrument(model, optimizer=opt, hang_after=float(os.environ["HANG_AFTER"]),
                          console="stderr", console_every=0)
    print("ready", rank, flush=True)
    for step in range(steps):
        loss = model(torch.randn(8, 16)).square().mean()
        opt.zero_grad(); loss.backward()
        t = torch.ones(1)
        if not (mode == "deadlock" and rank == odd and step == 3):
            dist.all_reduce(t)
        opt.step()
        if rank == odd and step == 4:
            if mode == "sleep":
                time.sleep(30)  # outside any collective, between two steps
            elif mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif mode == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)  # frozen: the test sends SIGCONT
        if mode == "slow":
            time.sleep(2.5)  # slow steps: each one progresses
        if mode == "checkpoint" and step == 2:
            with otel_train.region("checkpoint"):
                time.sleep(20)
    dist.barrier()
    assert otel_train.shutdown(), "shutdown missed its deadline"
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    with started_collector(tmp_path_factory.mktemp("hang-collector")) as col:
        yield col


def torchrun(collector: Collector, tmp: Path, ranks: int, mode: str, odd: int, steps: int,
             gloo_s: float = 300.0, direct: bool = False,
             cont_after: float = 0.0) -> dict[str, Any]:  # fmt: skip
    """Run the job to its end (or its failure); what the Collector got from it.
    ``direct``: start the ranks as plain processes (torchrun's agent stops every rank as
    soon as one dies; a cluster's launcher does not always)."""
    script = tmp / "job.py"
    script.write_text(JOB)
    since = len(collector.logs) - 1, len(collector.output())
    env = job_env(collector.endpoint, MODE=mode, ODD_RANK=str(odd), STEPS=str(steps),
                  HANG_AFTER=str(HANG_AFTER), GLOO_S=str(gloo_s),
                  OTEL_SERVICE_NAME=f"hang-{mode}-{ranks}-{os.getpid()}")  # fmt: skip
    env.pop("OTEL_TRAIN_CONSOLE", None)
    port = _free_port()
    started = time.monotonic()
    if direct:
        done = _launch(script, env, ranks, port, tmp, cont_after)
    else:
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
             f"--master_port={port}", str(script)],
            env=env, cwd=tmp, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    time.sleep(2.5)  # the last exports (logs batch every second)
    text = collector.output()[since[1] :]
    return {"done": done, "seconds": time.monotonic() - started, "text": text, "ranks": ranks,
            "odd": odd, "service": env["OTEL_SERVICE_NAME"]}  # fmt: skip


def _launch(script: Path, env: dict[str, str], ranks: int, port: int, tmp: Path,
            cont_after: float = 0.0) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """The ranks as plain processes (env:// rendezvous), each run to its end;
    ``cont_after``: seconds after a rank stopped that every rank gets SIGCONT."""
    procs = []
    for rank in range(ranks):
        rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                        LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port))  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, str(script)], env=rank_env, cwd=tmp,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))  # fmt: skip
    if cont_after:  # from when a rank stopped (its /proc state is T)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(_stopped(p.pid) for p in procs):
            time.sleep(0.1)
        time.sleep(cont_after)
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
    outs = [p.communicate(timeout=240) for p in procs]
    code = next((p.returncode for p in procs if p.returncode), 0)
    return subprocess.CompletedProcess(
        [str(script)], code, "".join(o for o, _ in outs), "".join(e for _, e in outs)
    )


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "T"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def records(run: dict[str, Any], event: str) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for r in log_records(run["text"]):
        if r["event"] == event:
            out.setdefault(r["rank"], []).append(r)
    return out


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_sleeping_rank_and_its_waiting_peers_each_report_the_hang(
    collector: Collector, tmp_path: Path, ranks: int
) -> None:
    odd = ranks - 1
    run = torchrun(collector, tmp_path, ranks, "sleep", odd, steps=8)
    assert run["done"].returncode == 0, run["done"].stderr[-4000:]
    hangs = records(run, c.HANG_EVENT)
    assert sorted(hangs) == list(range(ranks)), run["done"].stderr[-3000:]
    for rank, got in hangs.items():
        first = got[0]
        assert HANG_AFTER <= float(first[c.HANG_SECONDS.key]) <= HANG_AFTER + 5.0
        assert len(got) <= 3
        stack = first[c.HANG_STACKTRACE.key]
        assert "[training thread]" in stack
        if rank == odd:
            assert c.COLLECTIVE_OP.key not in first, first
            assert "time.sleep(30)" in stack
        else:  # waiting for the sleeper: in DDP's gradient all-reduce (or the explicit one)
            assert first[c.COLLECTIVE_OP.key] in ("ddp_all_reduce", "all_reduce"), first
            assert first[c.COLLECTIVE_GROUP.key] == "default_pg"
            assert int(first[c.COLLECTIVE_SEQ.key]) > 0
    resolved = records(run, c.HANG_RESOLVED_EVENT)
    assert sorted(resolved) == list(range(ranks))
    assert all(float(r[0][c.HANG_SECONDS.key]) >= 25.0 for r in resolved.values())
    ages = rank_values(run["text"], c.PROGRESS_AGE.name)
    assert all(max(ages.get(r, [0.0])) > HANG_AFTER for r in range(ranks)), ages
    assert "no progress for" in run["done"].stderr  # each rank's console line


def test_a_deadlock_shows_each_ranks_collective_and_sequence_number(
    collector: Collector, tmp_path: Path
) -> None:
    run = torchrun(collector, tmp_path, 2, "deadlock", 1, steps=8, gloo_s=20.0)
    assert run["done"].returncode != 0  # gloo's timeout ends it
    hangs = records(run, c.HANG_EVENT)
    assert sorted(hangs) == [0, 1], run["done"].stderr[-3000:]
    named = {r: (got[0][c.COLLECTIVE_OP.key], int(got[0][c.COLLECTIVE_SEQ.key]))
             for r, got in hangs.items()}  # fmt: skip
    # Rank 1 skipped one all_reduce: gloo paired the ranks' calls one apart, and at the end
    # rank 0 waits in an all_reduce that rank 1, one call ahead, meets with something else.
    assert named[0][0] == "all_reduce"
    assert named[0] != named[1], named


def test_the_peers_of_a_stopped_rank_report_their_hang_and_so_does_its_sidecar(
    collector: Collector, tmp_path: Path
) -> None:
    """A rank that stops answering without closing its connections (SIGSTOP: a frozen
    process, a dead node behind a switch): its peers wait in the all-reduce and report it;
    its own sidecar, alive, reports that the training process does not answer."""
    run = torchrun(collector, tmp_path, 2, "stop", 1, steps=8, direct=True, cont_after=18.0)
    assert run["done"].returncode == 0, run["done"].stderr[-4000:]
    hangs = records(run, c.HANG_EVENT)
    assert sorted(hangs) == [0, 1], run["done"].stderr[-3000:]
    assert hangs[0][0][c.COLLECTIVE_OP.key] in ("ddp_all_reduce", "all_reduce")
    assert HANG_AFTER <= float(hangs[0][0][c.HANG_SECONDS.key]) <= HANG_AFTER + 5.0
    assert any("did not answer" in r[c.HANG_STACKTRACE.key] for r in hangs[1]), [
        (r[c.HANG_SECONDS.key], r[c.HANG_STACKTRACE.key][:120]) for r in hangs[1]
    ]  # (it was frozen)
    assert sorted(records(run, c.HANG_RESOLVED_EVENT)) == [0, 1]


def test_the_survivors_of_a_killed_rank_fail_with_the_collectives_error(
    collector: Collector, tmp_path: Path
) -> None:
    """SIGKILL closes the killed rank's connections: gloo's survivors fail at once (no
    hang to report), and the failing phase carries gloo's error (exported at exit)."""
    run = torchrun(collector, tmp_path, 2, "kill", 1, steps=8, gloo_s=25.0, direct=True)
    assert run["done"].returncode != 0
    assert not records(run, c.HANG_EVENT)
    failed = [s for s in spans(run["text"]) if "exception.message" in s]
    assert any("by peer" in s["exception.message"] for s in failed), [
        (s["Name"], s["exception.message"][:200]) for s in failed
    ]


FROZEN = textwrap.dedent("""
    import os, signal, subprocess, time, torch, otel_train
    from otel_train.handover import feeder
    feeder.PROGRESS_S = 3600.0  # its thread tells the progress once, before any step
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    otel_train.instrument(model, optimizer=opt, hang_after=2.0, console_every=0)
    time.sleep(0.5)  # (that once: no boundary yet)
    for _ in range(5):
        model(torch.randn(4, 8)).sum().backward(); opt.step()
    # Frozen now, within a tick of its steps (the feeder's thread, which tells a changed
    # progress at its next tick and answers the watch's probe, is frozen too): a shell
    # lets it go on 9 s later.
    subprocess.Popen(["sh", "-c", f"sleep 9; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)
    model(torch.randn(4, 8)).sum().backward(); opt.step()
    assert otel_train.shutdown()
""")


def test_a_process_frozen_before_its_feeder_told_any_progress_is_still_reported(
    collector: Collector, tmp_path: Path
) -> None:
    """The sidecar knows the training thread's latest boundary from the steps that
    arrived, not only from the feeder's word each second: a process frozen (SIGSTOP)
    within a second of its first steps has its hang reported by its sidecar (the
    torchrun test above raced that second)."""
    script = tmp_path / "frozen.py"
    script.write_text(FROZEN)
    since = len(collector.output())
    env = job_env(collector.endpoint, OTEL_SERVICE_NAME=f"frozen-{os.getpid()}")
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    time.sleep(2.5)  # (the last exports)
    got = [r for r in log_records(collector.output()[since:]) if r["event"] == c.HANG_EVENT]
    assert got, done.stderr[-3000:]
    assert "did not answer" in got[0][c.HANG_STACKTRACE.key]
    assert 2.0 <= float(got[0][c.HANG_SECONDS.key]) <= 8.0


@pytest.mark.parametrize("mode", ["slow", "checkpoint"])
def test_slow_steps_and_a_long_checkpoint_are_no_hang(
    collector: Collector, tmp_path: Path, mode: str
) -> None:
    run = torchrun(collector, tmp_path, 2, mode, 1, steps=6 if mode == "slow" else 4)
    assert run["done"].returncode == 0, run["done"].stderr[-4000:]
    assert not records(run, c.HANG_EVENT)
    ages = rank_values(run["text"], c.PROGRESS_AGE.name)
    assert sorted(ages) == [0, 1]  # (the watch ran: its gauges arrived)
    if mode == "checkpoint":
        assert max(max(v) for v in ages.values()) > HANG_AFTER  # past the limit, in budget
        limits = rank_values(run["text"], c.PROGRESS_LIMIT.name)
        assert max(max(v) for v in limits.values()) == pytest.approx(10 * HANG_AFTER)


def test_bad_values_of_hang_after_are_config_errors() -> None:
    import otel_train

    for bad in (0, -1, "soon", "8s", 10**9):
        with pytest.raises(otel_train.ConfigError, match="'hang_after'"):
            otel_train.configure(hang_after=bad)
