"""DataLoader workers that fork or spawn, and phases on a second thread, against the real
Collector: no hang, every step exported once, nothing exported from a child, and
phases from another thread attributed by the documented rule.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from collector_helpers import metric_points, run_job, spans, step_indices, wait_for

EPOCHS, BATCHES = 4, 8

LOADER_WORKERS = textwrap.dedent("""
    import sys, time, torch, otel_train

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return torch.full((8,), float(i)), torch.tensor(i % 2)

    def main(context, epochs):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = torch.utils.data.DataLoader(
            Rows(), batch_size=8, num_workers=2, multiprocessing_context=context
        )
        otel_train.instrument(model, optimizer=opt, dataloader=loader)
        steps = 0
        for _ in range(epochs):   # each epoch starts new workers, copies of a later state
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
                steps += 1
                time.sleep(0.15)  # workers live across several metric export intervals
        time.sleep(1.0)
        assert otel_train.shutdown(), "shutdown missed its deadline"
        print(steps)

    if __name__ == "__main__":
        main(sys.argv[1], int(sys.argv[2]))
""")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_never_export(collector: Any, tmp_path: Path, context: str) -> None:
    collector.start()
    script = tmp_path / "loader.py"
    script.write_text(LOADER_WORKERS)
    done = run_job([str(script), context, str(EPOCHS)], collector.endpoint, timeout=300,
                   cwd=tmp_path)  # fmt: skip
    n = EPOCHS * BATCHES
    assert int(done.stdout.split()[-1]) == n
    wait_for(lambda: len(step_indices(collector.output())) >= n, f"{n} step spans")
    wait_for(
        lambda: any(v == n for _, v in metric_points(collector.output(), "otel_train.steps")),
        "the final step count",
    )
    out = collector.output()
    # Exactly once each: a child exporting its copy would repeat indices.
    assert sorted(step_indices(out)) == list(range(n))
    # A child exporting its copy of the counters would send an older, smaller total
    # after the parent's: the series as the Collector received it never goes back.
    totals = [v for _, v in metric_points(out, "otel_train.steps")]
    assert totals == sorted(totals), totals
    data = [s for s in spans(out) if s.get("Name") == "data"]
    assert len(data) == n  # the parent times next(loader) on every step


THREADS = textwrap.dedent("""
    import threading, time, torch, otel_train

    stop = threading.Event()
    started = []

    def rollouts():
        while not stop.is_set():
            with otel_train.phase("rollout"):
                time.sleep(0.004)
            started.append(1)
            time.sleep(0.001)

    model = torch.nn.Linear(8, 2)
    x = torch.randn(4, 8)
    otel_train.configure()
    worker = threading.Thread(target=rollouts)
    for i in range(STEPS):
        with otel_train.step(samples=4):
            if i == 0:
                worker.start()
            with otel_train.phase("forward"):
                loss = model(x).sum()
                time.sleep(0.005)
            with otel_train.phase("backward"):
                loss.backward()
                time.sleep(0.005)
        time.sleep(0.01)  # between steps (waiting for rollouts, say): no step is open
    stop.set(); worker.join()
    time.sleep(1.0)
    print(int(otel_train.shutdown()), len(started))
""")


def test_phases_on_a_rollout_thread_follow_the_open_step(collector: Any, tmp_path: Path) -> None:
    collector.start()
    steps = 60
    script = tmp_path / "threads.py"
    script.write_text(THREADS.replace("STEPS", str(steps)))
    done = run_job([str(script)], collector.endpoint, timeout=300, cwd=tmp_path)
    shutdown_ok, rollouts = (int(word) for word in done.stdout.split()[-2:])
    wait_for(lambda: len(step_indices(collector.output())) >= steps, f"{steps} step spans")

    def late_phases() -> list[float]:
        points = metric_points(collector.output(), "otel_train.dropped")
        return [v for a, v in points if a.get("reason") == "late_phase"]

    wait_for(late_phases, "otel_train.dropped{reason=late_phase}")
    out = collector.output()
    all_spans = spans(out)
    by_id = {s["ID"]: s for s in all_spans}
    roots = [s for s in all_spans if s.get("Name") == "otel_train.step"]
    print(f"\nthreads: {len(roots)} step spans, {rollouts} rollouts")
    # The training thread's steps are all there, with their own phases.
    # Only the training thread's steps, each once: a rollout between steps opens none.
    assert sorted(int(r["otel_train.step.index"]) for r in roots) == list(range(steps))
    assert all(r.get("otel_train.step.samples") == "4" for r in roots)
    totals = [v for _, v in metric_points(out, "otel_train.steps")]
    assert max(totals) == steps
    rollout_spans = [s for s in all_spans if s.get("Name") == "rollout"]
    assert rollout_spans
    ends = sorted(r["End time"] for r in roots)
    for span in rollout_spans:
        # Rule: a background thread's phase joins the step open when it ends, or else
        # the next step to end (docs/failures.md, "Threads"): the first step ending after it.
        parent = by_id[span["Parent ID"]]
        assert parent["Name"] == "otel_train.step"
        assert parent["Trace ID"] == span["Trace ID"]
        assert parent["End time"] == next(e for e in ends if e >= span["End time"])
    # Every rollout is in a step, or (ended after the last step) dropped at shutdown.
    assert len(rollout_spans) + int(max(late_phases())) == rollouts
    assert shutdown_ok == 0  # the late phases were dropped: shutdown() says False
