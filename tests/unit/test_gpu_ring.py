"""A GPU job's boundaries through the ring (handover/raw.py's stamped sessions): the
hooks write slots and stamps, the feeder's thread resolves the events
(handover/event_times.py), and the sidecar's replica applies the slots with the resolved
times. Against the stand-in runtime (tests/unit/cuda_standin.py), whose device time is
the host's at an event's record plus ``Runtime.lag_ns``: raising the lag inside a phase
makes its device time longer than its host time by exactly that much."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cuda_standin
import pytest
from otel_helpers import epochs_until_raw, tiny_loader, tiny_model, train_epoch

import otel_train
from otel_train import contract as c
from otel_train import session as session_mod
from otel_train.handover.event_times import EventTimes
from otel_train.recording import ring as ring_mod
from otel_train.recording.device import EventPool, ResolvedEvent
from otel_train.recording.recorder import ADAPTER, Recorder, boundary
from otel_train.recording.ring import Ring
from otel_train.settings import Settings

JUMP_NS = 20_000_000  # device time a forward takes beyond its host time


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[cuda_standin.Runtime]:
    with cuda_standin.installed(monkeypatch) as runtime:
        yield runtime


def _native_or_fail() -> None:
    """The C writer is needed: skipped where it was not built, unless
    OTEL_TRAIN_NATIVE_REQUIRED=1 (CI, which installs the package) makes that a failure."""
    if ring_mod.NATIVE is None:
        if os.environ.get("OTEL_TRAIN_NATIVE_REQUIRED") == "1":
            pytest.fail("otel_train.recording._ring was not built (setup.py)")
        pytest.skip("the C writer was not built")


def _job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Any, Any, Any, Any]:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    model, opt = tiny_model()
    loader = tiny_loader(n=64, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, prometheus=False,
                          console="off", run_dir=str(tmp_path), trace_steps="all")  # fmt: skip
    sess = session_mod.current()
    assert sess is not None and sess.feeder is not None  # the sidecar consumes
    return model, opt, loader, sess


def _spans(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    (traces,) = tmp_path.glob("*/rank0.traces.jsonl")
    return [
        s
        for line in traces.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
        if s["name"] == name
    ]


def _attr(span: dict[str, Any], key: str) -> Any:
    for a in span["attributes"]:
        if a["key"] == key:
            return next(iter(a["value"].values()))
    return None


@pytest.mark.parametrize("writer", ["python", "c"])
def test_the_sidecar_times_a_gpu_jobs_phases_with_the_events_resolved_here(
    rt: cuda_standin.Runtime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, writer: str
) -> None:
    if writer == "python":  # (the writer where the C one does not build)
        monkeypatch.setattr(ring_mod, "NATIVE", None)
    else:
        _native_or_fail()
    model, opt, loader, sess = _job(monkeypatch, tmp_path)
    assert sess.feeder.handover.ring.native is (writer == "c")
    handover = sess.feeder.handover
    rec = sess.recorder
    try:
        epochs = epochs_until_raw(model, opt, loader, handover)
        assert handover.raw and handover.stamped
        first = sess.feeder.stats.get("steps", 0)

        def slower(module: Any, args: Any) -> None:  # (inside the timed forward)
            rt.lag_ns += JUMP_NS

        hook = model[0].register_forward_pre_hook(slower)
        train_epoch(model, opt, loader)
        hook.remove()
        train_epoch(model, opt, loader)
        assert handover.raw and handover.left == 0, "the stamped session went on"
        assert otel_train.flush(10.0)
        assert sess.feeder.stats["steps"] == (epochs + 2) * len(loader)
    finally:
        otel_train.shutdown()
    assert first >= 0
    forwards = _spans(tmp_path, "forward")
    assert len(forwards) == (epochs + 2) * len(loader)
    assert {_attr(s, c.PHASE_CLOCK.key) for s in forwards} == {"device"}
    beyond = [
        int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])
        - round(float(_attr(s, c.PHASE_HOST_DURATION.key)) * 1e9)
        for s in forwards
    ]  # fmt: skip
    slowed = beyond[epochs * len(loader) : (epochs + 1) * len(loader)]
    others = beyond[: epochs * len(loader)] + beyond[(epochs + 1) * len(loader) :]
    # (the stamp is taken just after the hook's clock: microseconds apart)
    assert all(abs(b - JUMP_NS) < 2_000_000 for b in slowed), slowed
    assert all(abs(b) < 2_000_000 for b in others), others
    assert rec.events.created < 200, "the ring's events go back to the pool"


@pytest.mark.parametrize("writer", ["python", "c"])
def test_each_writer_keeps_each_boundarys_stamp_at_its_slot(writer: str) -> None:
    """The C writer as the Python one: the stamp taken after the slot's clock, kept at
    the slot's index (overwriting the one a ring before), none for a refused write."""
    if writer == "c":
        _native_or_fail()
    ring = Ring(Recorder(Settings()), capacity=4, native=writer == "c")
    taken: list[int] = []

    def stamper() -> tuple[int, None, bool]:
        taken.append(len(taken))
        return (taken[-1], None, True)

    ring.writer.open = 1
    ring.stamp_with(stamper)
    b = boundary("forward", "backward", begin=ADAPTER)
    counted = boundary("data", None, counted=True)
    ring.writer.transition(b)
    ring.writer.counted(counted, 8, None, None, 0)
    assert [ring.stamp_at(p) for p in range(2)] == [(0, None, True), (1, None, True)]
    ring.writer.acked = 2  # (the reader let go of two: the ring wraps onto them)
    for _ in range(4):
        ring.writer.transition(b)
    assert ring.writer.pos == 6 and len(taken) == 6
    assert [ring.take_stamp_at(p)[0] for p in range(2, 6)] == [2, 3, 4, 5]
    assert ring.stamp_at(2) is None  # (taken)
    ring.writer.transition(b)  # (a ring not let go of: refused, no stamp taken)
    assert ring.writer.pos == 6 and len(taken) == 6
    ring.stamp_with(None)
    ring.writer.acked = 6
    ring.writer.transition(b)
    assert len(taken) == 6 and ring.stamp_at(6) is None
    ring.close()


def test_events_resolve_in_ring_order_up_to_the_first_not_completed(
    rt: cuda_standin.Runtime,
) -> None:
    """A chain: each event placed at the last one's time plus the elapsed time between
    the two; an event not completed stops the resolution until it has."""

    class Recorder:  # what a Ring needs of its recorder
        stack_getter = staticmethod(lambda: [])
        refused_write = ring_due = staticmethod(lambda *a: None)

    ring = Ring(Recorder(), capacity=16, native=False)
    pool = EventPool(device=0)
    ring.writer.open = 1
    ring.stamp_with(lambda: (pool.record(), (1, 2, 3, 4), True))
    rt.auto_complete = False
    stack: list[Any] = []
    for name in ("a", "b", "c"):
        assert ring.put_entry((stack, time.perf_counter_ns(), 0, name))
        time.sleep(0.002)
    times = EventTimes(ring, pool)
    assert times.resolve(ring.writer.pos) == [] and times.upto == 0
    evs = [ring.stamp_at(p)[0] for p in range(3)]
    evs[0].done = evs[1].done = True
    out = times.resolve(ring.writer.pos)
    assert times.upto == 2 and [r[1:] for r in out] == [((1, 2, 3, 4), True)] * 2
    evs[2].done = True
    out += times.resolve(ring.writer.pos)
    assert times.upto == 3
    resolved = [ResolvedEvent(ns) for ns, _, _ in out]
    for i in (1, 2):
        want = evs[0].elapsed_time(evs[i])
        assert resolved[0].elapsed_time(resolved[i]) == pytest.approx(want, abs=1e-6)


def test_a_stamped_session_ended_by_a_state_query_counts_every_step_once(
    rt: cuda_standin.Runtime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The training process catches up from the last idle point the sidecar reported,
    with the table's real events: what the sidecar was told is released here, what it
    was not (events not resolved yet) goes on from here."""
    model, opt, loader, sess = _job(monkeypatch, tmp_path)
    handover = sess.feeder.handover
    try:
        epochs = epochs_until_raw(model, opt, loader, handover)
        rt.auto_complete = False  # (the device falls behind: nothing resolves)
        train_epoch(model, opt, loader)
        assert sess.recorder.current_step is None  # the state asked for: the session ends
        assert handover.left == 1 and not handover.raw and handover.caught_up > 0
        rt.auto_complete = True
        rt.complete()
        train_epoch(model, opt, loader)
        assert otel_train.flush(10.0)
        assert sess.feeder.stats["steps"] == (epochs + 2) * len(loader)
    finally:
        otel_train.shutdown()
