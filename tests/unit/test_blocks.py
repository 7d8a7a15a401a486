"""Recognised steps taken as blocks (recording/templates.py) give what the replay gives.

One real instrumented loop logs its boundaries with the worker stopped. The same log,
times included, is then processed twice: by a worker that takes blocks and by one that
replays every step. Spans, metrics and the console must come out the same.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from otel_helpers import providers, tiny_loader, tiny_model, train_epoch

import otel_train
from otel_train import contract as c
from otel_train.recording.recorder import PhaseStack
from otel_train.testing import InMemoryTelemetry

SETTINGS = {
    "console": "stdout",
    "console_every": 10,
    "flops_per_step": 1.0e6,
    "peak_tflops": 1.0,
    "throughput_window": 1000,
    "sidecar": "off",  # (the worker in this process, stopped: its process() runs here)
}


def _loop(model: torch.nn.Module, opt: torch.optim.Optimizer, loader: Any) -> None:
    """Plain steps, epoch ends, an explicit phase, gradient accumulation, scalars recorded
    after and inside steps."""
    for _ in range(3):
        train_epoch(model, opt, loader)
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if i == 1:
            with otel_train.phase("clip"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    for _ in range(4):  # two micro-batches per optimizer step
        it = iter(loader)
        opt.zero_grad()
        for _ in range(2):
            x, y = next(it)
            torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    for _ in range(2):
        train_epoch(model, opt, loader, record=True)  # scalars after each step: loose
    for _ in range(2):
        for x, y in loader:  # scalars inside each step
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            otel_train.record(loss=loss, lr=0.01)
            opt.step()
    for _ in range(2):
        train_epoch(model, opt, loader)


def _stopped_session(tel: InMemoryTelemetry, model: Any, opt: Any, loader: Any, **kw: Any) -> Any:
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, **{**SETTINGS, **kw}, **providers(tel)
    )
    session = otel_train.session.current()
    assert session is not None and session.recorder._defer
    session.worker._stop.set()  # its process() runs below, on this thread
    session.worker._thread.join(5)
    return session


def _outcome(tel: InMemoryTelemetry) -> tuple[list[Any], dict[str, list[Any]]]:
    finished = tel.spans()
    zero = min(s.start_time for s in finished)  # (each session maps its clock to epoch time)
    spans = sorted(
        (s.name, s.start_time - zero, s.end_time - zero, sorted(s.attributes.items()))
        for s in finished
    )
    metrics: dict[str, list[Any]] = {}
    for name, m in tel.metrics().items():
        if name in (c.OVERHEAD.name, c.PROGRESS_AGE.name) or name.startswith(
            ("otel_train.process.", "process.")
        ):
            continue  # the worker's CPU time, the last boundary's age, the process's memory
        points = []
        for p in m.data.data_points:
            attrs = sorted(p.attributes.items())
            if hasattr(p, "bucket_counts"):
                points.append((attrs, list(p.bucket_counts), p.count, p.sum, p.min, p.max))
            else:
                points.append((attrs, p.value))
        metrics[name] = sorted(points, key=repr)
    return spans, metrics


def _close(a: Any, b: Any) -> bool:
    """Equal, floats within 1e-9 relative (running sums against sums of columns)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.parametrize(
    "sampling",
    [
        # trace windows close by count inside blocks; steps leave the throughput window
        {"trace_window": 7, "trace_slowest": 2, "throughput_window": 6},
        # trace windows close by time; the throughput window holds every step
        {"trace_window": 1000, "trace_window_seconds": 0.01, "trace_slowest": 1},
    ],
)
def test_blocks_give_what_the_replay_of_each_step_gives(
    sampling: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    tel_blocks = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=40, batch_size=8)
    session = _stopped_session(tel_blocks, model, opt, loader, **sampling)
    rec = session.recorder
    _loop(model, opt, loader)
    logged = list(rec._log)
    assert len(logged) > 400
    rec.drain_blocks = _counting(rec.drain_blocks, taken := [])
    session.worker.process()
    otel_train.shutdown()
    out_blocks = capsys.readouterr().out
    assert sum(taken) >= 40  # most steps went as blocks; the rest were replayed
    shapes = [t for ts in rec._templates.values() for t in ts]
    assert any(t.loose for t in shapes) and any(t.scalars for t in shapes)

    tel_replay = InMemoryTelemetry()
    model2, opt2 = tiny_model()
    session = _stopped_session(
        tel_replay, model2, opt2, tiny_loader(n=40, batch_size=8), **sampling
    )
    rec = session.recorder
    rec.blocks = False
    stacks: dict[int, PhaseStack] = {}
    for item in logged:  # the same entries and times, on this recorder's own stacks
        stack = item[0]
        if stack is not None:
            stack = stacks.setdefault(id(stack), PhaseStack())
        rec._log.append((stack, *item[1:]))
    session.worker.process()
    otel_train.shutdown()
    out_replay = capsys.readouterr().out

    spans_b, metrics_b = _outcome(tel_blocks)
    spans_r, metrics_r = _outcome(tel_replay)
    assert len(spans_b) >= 10
    assert spans_b == spans_r
    assert metrics_b.keys() == metrics_r.keys()
    for name in metrics_b:
        assert _close(metrics_b[name], metrics_r[name]), name
    assert out_blocks == out_replay
    assert "steps 0-9" in out_blocks


def _counting(drain: Any, taken: list[int]) -> Any:
    def wrapped() -> Any:
        out = drain()
        taken.extend(block.k for _, block in out)
        return out

    return wrapped


def test_another_threads_boundary_ends_a_block() -> None:
    """A log mixing two threads' steps is replayed on each thread's stack (no block spans
    entries of both)."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=16, batch_size=8)
    session = _stopped_session(tel, model, opt, loader, trace_steps="all", console="off")
    rec = session.recorder
    train_epoch(model, opt, loader)
    train_epoch(model, opt, loader)
    # the same boundaries from another thread, interleaved after the first epoch's steps
    import threading

    t = threading.Thread(target=train_epoch, args=(model, opt, loader))
    t.start()
    t.join(30)
    train_epoch(model, opt, loader)
    session.worker.process()
    otel_train.shutdown()
    steps = [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
    assert sorted(s.attributes[c.STEP_INDEX.key] for s in steps) == list(range(8))
    assert rec._templates  # the plain step was recognised
