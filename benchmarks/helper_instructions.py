"""Everything otel-train runs per step with the sidecar, the helper's instructions included.

``instructions.py`` counts one process: the training thread and an in-process worker.
With the sidecar (the default) the work is split: the training thread writes the ring,
and the helper process reads it, replays it, aggregates, samples, builds spans and
exports them. This runs the job under ``valgrind --tool=callgrind --trace-children=yes``
so that the helper is counted too, with the OTLP variant's settings: exports go to
benchmarks/otlp_sink.py on loopback, started outside valgrind (its work is the
Collector's, not ours).

Two kinds of work are counted apart, because callgrind cannot compare them as they run:

- **Per step.** Under callgrind a step takes ~50x its native time, so what both
  processes run by the clock (the feeder's ticks, the helper's worker ticks, its hang
  watch, the replica's reports, the run record's metric snapshot every 5 s: ~20 million
  instructions each) runs ~50x as often per step as natively and swamps the step's own
  work. So the clocks are slowed a thousandfold for this part (the feeder's in
  the training process; the helper's through a ``sitecustomize`` on its path, read at its
  start), and the helper runs its worker's batch at a signal after each chunk, as its
  worker thread would (reading the ring, the replica's replay, blocks, metrics,
  sampling, spans). Per round:

  - plain: the same job without instrumentation, the training process between markers;
  - one SDK span per phase and per step on that job, as in instructions.py;
  - otel-train, empty: the helper's counters over a batch with no step;
  - otel-train: ``--steps`` steps in a raw session, the training process between
    markers, the helper's counters from before the chunk to the end of its batch;
  - a flush (every metric series exported, once a minute natively), counted apart.

  The helper's share per step is the sum over the rounds of (batch - empty) over their
  steps: a sampled trace's export (one per 1,000-step window) falls in some rounds.

- **By the clock**, per second of wall time with the real clocks and no step: the
  training process (the feeder's thread) and the helper, each over ``--idle`` seconds,
  pooled over the rounds. Callgrind slows each tick's work, not how often it comes, so
  these are the native figures; per step they are that rate times the step's native
  time, printed for the instructions.py job's step measured here and for a 2 ms step.
  The run record's metric snapshot (every 5 s, ~9 million instructions) is most of it: a
  window holds a whole number of them, so the snapshots per second the windows held are
  printed beside the rate (one in 5 s is the true rate; short windows were off by up to
  a snapshot each).

With ``--cuda-standin`` the job is GPU-shaped, as in instructions.py: the training
process runs on tests/unit/cuda_standin.py (a stand-in CUDA runtime; the model stays on
the CPU), so the recorder times "the device" and a raw session's slots are stamped (an
event and an allocator read per boundary). The feeder's thread resolves those events
and tells the sidecar each slot's device time (handover/event_times.py); with its clocks
slowed it would not within a chunk, so each ``ours`` chunk is followed by a ``resolve``
chunk, what that thread would do for those steps: its idle pump until the events are
resolved up to the ring's written position (the RING messages written to the pipe
included). The training process's share is both chunks; the helper's batch then
applies the slots. The CUDA calls per step (the stand-in's counts, both chunks) are
printed, and the instructions include the stand-in's own Python for them (its cost is
not the runtime's: an upper bound). Both runs (per step and by the clock) use it.

Metric export is set to once an hour, so that no periodic export falls in a chunk, and
the trace sampler's window to its 1,000 steps alone: its 60 seconds, ~50x fewer steps
under callgrind, would trace a step every few chunks.

Usage: python benchmarks/helper_instructions.py [--steps 400] [--rounds 5] [--idle 20]
       [--cuda-standin]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from instructions import cuda_calls, marker, native_plain_step_us, totals

from otel_train.export.record import RECORD_INTERVAL_S

SCALE_ENV = "OTEL_TRAIN_BENCH_TICK_SCALE"
DONE_ENV = "OTEL_TRAIN_BENCH_DONE"
# Read by the helper at its start (its path has this file's directory first): its clocks
# slowed as the training process's feeder is below.
SITECUSTOMIZE = f"""
import os
_scale = float(os.environ.get("{SCALE_ENV}", "0") or 0)
if _scale > 1:
    import signal
    import threading
    from otel_train.export import setup as _setup
    from otel_train.processing import worker as _worker
    from otel_train.sidecar import agent as _agent
    from otel_train.sidecar import replica as _replica

    _replica.REPORT_S *= _scale
    _setup.RECORD_INTERVAL_S *= _scale  # (the run record's metric snapshots)
    _start = _worker.Worker.start
    _init = _agent.Agent.__init__

    def _slow_start(self):
        self.poll_s *= _scale
        _start(self)

    def _init_with_signal(self, *args, **kwargs):
        # Its threads start with the signal blocked: it reaches the main thread, whose
        # read of the pipe it interrupts (taken by another thread, the handler would wait
        # for the next message).
        signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR1}})
        _init(self, *args, **kwargs)

        def _batch():  # the worker's batch, run now; then tell the benchmark
            n = self.worker.process()
            with open(os.environ["{DONE_ENV}"], "a") as f:
                f.write(f"{{n}}\\n")

        def _take(signum, frame):
            # On a thread of its own: the interrupted main thread may hold the replica's
            # lock (applying a RING message), which the batch takes too.
            threading.Thread(target=_batch, name="bench-batch").start()

        signal.signal(signal.SIGUSR1, _take)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGUSR1}})

    _worker.Worker.start = _slow_start
    _agent.Agent.__init__ = _init_with_signal
"""
FEEDER_CLOCKS = ("TICK_S", "IDLE_PUMP_S", "PROGRESS_S")
# A flush's bound: under callgrind the sidecar's answer comes ~50x later than natively
# (the default 5 s ran out in a GPU-shaped run: the flush's work went on past its dump,
# and the sidecar's figures, steps_lost's count, were not read).
FLUSH_S = 600.0


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def _helper_dump(pid: int, out_dir: Path) -> int:
    """Dump the helper's counters now (they start again from zero); its instructions."""
    before = set(out_dir.glob(f"cg.{pid}.*"))
    _control("-d", str(pid))
    for _ in range(600):
        new = set(out_dir.glob(f"cg.{pid}.*")) - before
        if new:
            time.sleep(0.2)  # (give callgrind a moment to finish writing it)
            return totals(max(new, key=lambda p: int(p.suffix[1:])))
        time.sleep(0.1)
    raise SystemExit(f"the helper (pid {pid}) wrote no dump")


def _snapshots() -> int:
    """The run record's metric snapshots so far (one line each), every process's."""
    files = Path(os.environ["OTEL_TRAIN_RUN_DIR"]).rglob("*.metrics*.jsonl")
    return sum(len(f.read_bytes().splitlines()) for f in files)


def inner(args: argparse.Namespace) -> None:
    import overhead as ob
    import torch

    import otel_train
    from otel_train import session
    from otel_train.handover import feeder

    torch.set_num_threads(1)
    rt = None
    if args.cuda_standin:  # (in use from the start, as instructions.py's GPU-shaped job)
        sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "unit"))
        import cuda_standin
        import pytest

        standin = cuda_standin.installed(pytest.MonkeyPatch())  # (held: its exit uninstalls)
        rt = standin.__enter__()
    model, opt, loader = ob.make_job(args.hidden, args.batch, 64)
    provider = ob.sdk_tracer_provider()
    tracer = provider.get_tracer("bench")
    rows: list[dict[str, Any]] = [{} for _ in range(args.rounds)]
    order: list[tuple[int, str]] = []
    out_dir = Path(args.inner).parent

    def chunk(r: int, key: str, run: Any) -> None:
        gc.collect()
        marker()
        run()
        marker()
        order.append((r, key))

    if args.clocks:  # the real clocks, no step: what each process runs by them
        otel_train.instrument(model, optimizer=opt, dataloader=loader)
        sess = session.current()
        assert sess is not None and sess.feeder is not None, "the sidecar did not start"
        helper = sess.feeder.process.proc.pid
        ob.plain_steps(model, opt, loader, 300)
        otel_train.flush(FLUSH_S)
        _control("-i", "on", str(helper))
        _control("-i", "on", str(os.getpid()))
        time.sleep(1.0)
        for r in range(args.rounds):
            _helper_dump(helper, out_dir)  # (zeroes it)
            t, before = time.monotonic(), _snapshots()
            chunk(r, "idle", lambda: time.sleep(args.idle))
            rows[r]["helper_idle"] = _helper_dump(helper, out_dir)
            rows[r]["idle_s"] = time.monotonic() - t
            rows[r]["snapshots"] = _snapshots() - before
        Path(args.inner).with_suffix(".order").write_text(json.dumps(order))
        Path(args.inner).write_text(json.dumps(rows))
        otel_train.shutdown()
        return

    # Plain and spans first, before otel-train is in the process at all (its backward
    # wrapper is process-wide, and its feeder's thread would run beside them).
    ob.plain_steps(model, opt, loader, 300)
    ob.span_steps(model, opt, loader, 50, tracer)
    provider.force_flush()
    _control("-i", "on", str(os.getpid()))
    time.sleep(0.5)
    for r in range(args.rounds):
        chunk(r, "plain", lambda: ob.plain_steps(model, opt, loader, args.steps))
        chunk(r, "spans", lambda: ob.span_steps(model, opt, loader, args.steps, tracer))
        provider.force_flush()  # (its export runs on its thread: not in the next chunk)
    for name in FEEDER_CLOCKS:
        setattr(feeder, name, getattr(feeder, name) * args.scale)
    os.environ[SCALE_ENV] = str(args.scale)  # (the helper reads these at its start)
    os.environ[DONE_ENV] = str(out_dir / "done")
    otel_train.instrument(model, optimizer=opt, dataloader=loader)
    sess = session.current()
    assert sess is not None and sess.feeder is not None, "the sidecar did not start"
    helper = sess.feeder.process.proc.pid
    ob.plain_steps(model, opt, loader, 300)  # (past the FLOP count: raw sessions begin)
    otel_train.flush(FLUSH_S)
    _control("-i", "on", str(helper))
    time.sleep(0.5)
    done = Path(os.environ[DONE_ENV])

    def answers() -> list[str]:
        return done.read_text().splitlines() if done.exists() else []

    def helper_batch(expect: int) -> int:
        """The helper's worker batch, run now (the signal) until it has taken ``expect``
        steps: its instructions since the last dump."""
        taken = 0
        for _ in range(20):
            before = len(answers())
            # What the feeder's (slowed) thread would have told it: a raw session, codes.
            sess.feeder.pump(idle=True)
            time.sleep(1.0)  # (read off the pipe on its main thread, slowed by callgrind)
            os.kill(helper, signal.SIGUSR1)
            deadline = time.monotonic() + 600
            while len(now := answers()) == before:
                if time.monotonic() > deadline:
                    raise SystemExit("the helper did not run its batch")
                time.sleep(0.05)
            taken += int(now[-1])
            if taken >= expect:
                break
        return _helper_dump(helper, out_dir)

    def resolve() -> None:
        """What the feeder's (slowed) thread would do for the chunk's steps: its pumps,
        each resolving the events in ring order and telling the sidecar (RING)."""
        ring, handover = sess.feeder.ring, sess.feeder.handover
        for _ in range(1000):
            if handover.times.upto >= ring.writer.pos:
                return
            sess.feeder.pump(idle=True)  # (skips while the feeder's thread pumps: again)
            if handover.times.upto < ring.writer.pos:
                time.sleep(0.01)
        raise SystemExit(f"events resolved to {handover.times.upto}, written {ring.writer.pos}")

    run = 300
    for r in range(args.rounds):
        ob.plain_steps(model, opt, loader, 100)  # (a raw session again after the flush)
        helper_batch(99)  # (an exhausted loader's leftover step may wait)
        rows[r]["helper_empty"] = helper_batch(0)
        before = cuda_calls(rt)
        chunk(r, "ours", lambda: ob.plain_steps(model, opt, loader, args.steps))
        if rt is not None:
            handover = sess.feeder.handover
            if not (handover.raw and handover.stamped):
                raise SystemExit("the chunk ran in no stamped raw session")
            chunk(r, "resolve", resolve)
            after = cuda_calls(rt)
            rows[r]["event_records"] = after[0] - before[0]
            rows[r]["allocator_reads"] = after[1] - before[1]
        rows[r]["helper"] = helper_batch(args.steps - 1)
        otel_train.flush(FLUSH_S)  # (every metric series exported: once a minute natively)
        rows[r]["helper_flush"] = _helper_dump(helper, out_dir)
        run += 100 + args.steps
        rows[r]["steps_lost"] = run - sess.feeder.stats.get("steps", 0)
    Path(args.inner).with_suffix(".order").write_text(json.dumps(order))
    Path(args.inner).write_text(json.dumps(rows))
    otel_train.shutdown()


def _run(args: argparse.Namespace, env: dict[str, str], clocks: bool) -> list[dict[str, Any]]:
    """One callgrind run (per-step part, or the clocks); its rows, the training
    process's chunks filled in from its dumps."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "sitecustomize.py").write_text(SITECUSTOMIZE)
        path = [tmp, str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
        run_env = dict(env, PYTHONPATH=os.pathsep.join(path))
        rows_file = Path(tmp) / "rows.json"
        cmd = ["valgrind", "--tool=callgrind", "--trace-children=yes",
               "--trace-children-skip=*callgrind_control*,*perl*",
               "--instr-atstart=no", "--dump-before=getppid",
               f"--callgrind-out-file={tmp}/cg.%p", "-q", sys.executable, __file__,
               "--inner", str(rows_file), "--steps", str(args.steps), "--rounds",
               str(args.rounds), "--idle", str(args.idle), "--scale", str(args.scale),
               "--hidden", str(args.hidden), "--batch", str(args.batch)]  # fmt: skip
        if args.cuda_standin:
            cmd.append("--cuda-standin")
        if clocks:
            cmd.append("--clocks")
        subprocess.run(cmd, env=run_env, check=True)
        if os.environ.get("KEEP"):  # (the dumps, for callgrind_annotate)
            shutil.copytree(tmp, Path(os.environ["KEEP"]) / ("clocks" if clocks else "steps"))
        rows = json.loads(rows_file.read_text())
        order = json.loads(rows_file.with_suffix(".order").read_text())
        main_pid = min(int(p.name.split(".")[1]) for p in Path(tmp).glob("cg.*.*"))
        dumps = sorted(Path(tmp).glob(f"cg.{main_pid}.*"), key=lambda p: int(p.suffix[1:]))
        # The training process's dumps: one before the first marker, then per chunk its
        # count and the gap after it, in the order the chunks ran.
        for i, (r, key) in enumerate(order):
            rows[r][key] = totals(dumps[1 + 2 * i])
        return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400, help="steps per chunk")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of each idle count")
    ap.add_argument("--scale", type=float, default=1000.0,
                    help="how much slower the clocks run for the per-step part")  # fmt: skip
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cuda-standin", action="store_true",
                    help="a GPU-shaped job on tests/unit/cuda_standin.py")  # fmt: skip
    ap.add_argument("--clocks", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner(args)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("helper_instructions.py needs valgrind (apt-get install valgrind)")
    sink = subprocess.Popen([sys.executable, str(Path(__file__).parent / "otlp_sink.py")],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert sink.stdout is not None
    port = sink.stdout.readline().split()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
               OTEL_EXPORTER_PROMETHEUS_PORT="0", OTEL_SERVICE_NAME="helper-instructions",
               OTEL_METRIC_EXPORT_INTERVAL="3600000", OTEL_TRAIN_CONSOLE="off",
               OTEL_TRAIN_TRACE_WINDOW_SECONDS="86400")  # fmt: skip
    try:
        t = time.monotonic()
        with tempfile.TemporaryDirectory() as runs:  # (the run record, on as at defaults)
            env["OTEL_TRAIN_RUN_DIR"] = runs
            rows = _run(args, env, clocks=False)
            idle = _run(args, env, clocks=True)
        took = time.monotonic() - t
    finally:
        sink.terminate()
        sink.wait()
    step_us = native_plain_step_us(args.hidden, args.batch)
    n = args.steps

    def med(values: Any) -> float:
        return statistics.median(list(values))

    plain = med(r["plain"] / n for r in rows)
    spans = med(r["spans"] / n for r in rows) - plain
    thread = med(r["ours"] / n for r in rows) - plain
    # (a GPU-shaped job: the feeder's resolution of the chunk's events, its own chunk)
    resolution = med(r.get("resolve", 0) / n for r in rows)
    train = med((r["ours"] + r.get("resolve", 0)) / n for r in rows) - plain
    # Over all rounds: a sampled trace's export (one per 1,000-step window, ~10 million
    # instructions: OTLP and the run record) falls in some rounds, and is per-step work.
    helper = sum(r["helper"] - r["helper_empty"] for r in rows) / (n * len(rows))
    helper_median = med((r["helper"] - r["helper_empty"]) / n for r in rows)
    flush = med(r["helper_flush"] for r in rows)
    # Pooled over the rounds, not a median of them: a window holds a whole number of the
    # run record's 5 s snapshots (~9 million instructions each), so one window's rate is
    # off by up to a snapshot; the pooled one by one over all the windows (printed below).
    idle_s = sum(r["idle_s"] for r in idle)
    rate = sum(r["idle"] + r["helper_idle"] for r in idle) / idle_s
    snapshot_rate = sum(r["snapshots"] for r in idle) / idle_s
    together = train + helper
    print(f"callgrind runs: {took:.0f} s; MLP 784-{args.hidden}-{args.hidden}-10, batch "
          f"{args.batch} ({step_us:.0f} us a step natively); {args.rounds} rounds of "
          f"{n}-step chunks; medians of the rounds"
          + ("; CUDA stand-in (GPU-shaped)" if args.cuda_standin else ""))  # fmt: skip
    print("\nper step, the clocks slowed (the helper's batch run at a signal):")
    print(f"  plain                             {plain:>10,.0f}")
    if args.cuda_standin:
        print(f"  training thread over plain        {thread:>10,.0f}")
        print(f"  feeder's resolution (RING)        {resolution:>10,.0f}")
    print(f"  training process over plain       {train:>10,.0f}")
    print(f"  helper (its batch less an empty)  {helper:>10,.0f}  (all rounds' steps; the"
          f" median round {helper_median:,.0f})")  # fmt: skip
    print(f"  together                          {together:>10,.0f}")
    print(f"  one SDK span per phase            {spans:>10,.0f}")
    print(f"  ratio together / span per phase   {together / spans:>10.3f}  (target <= 0.1)")
    if args.cuda_standin:
        records = med(r["event_records"] / n for r in rows)
        reads = med(r["allocator_reads"] / n for r in rows)
        print(f"  CUDA calls per step: {records:.2f} event records, {reads:.2f} allocator reads"
              " (each a stats read and a peak reset)")  # fmt: skip
    print("\nby the clock, natively (both processes, per second of wall time with no step:")
    print(f"  {rate:,.0f}, the run record's snapshots {snapshot_rate:.3f} a second, every"
          f" {RECORD_INTERVAL_S:.0f} s: {1 / RECORD_INTERVAL_S:.3f}),")  # fmt: skip
    print(f"  and the metric export (a flush: {flush:,.0f}, once a minute):")
    steps = ((f"this job's {step_us:.0f} us step", step_us / 1e6), ("a 2 ms step", 2e-3))
    for label, step_s in steps:
        extra = rate * step_s + flush * step_s / 60
        ratio = (together + extra) / spans
        print(f"  at {label}: +{extra:,.0f} a step, ratio with it {ratio:.3f}")
    for r in rows:
        print("  round:", {k: round(v) for k, v in r.items()})
    for r in idle:
        print("  idle round:", {k: round(v, 2) for k, v in r.items()})


if __name__ == "__main__":
    main()
