"""One trace across processes (issue 15), one process at a time: the trainer's session
hands out carriers, then a fresh session plays the generator with them. Real SDK
providers with in-memory exporters; the real two-process run against the Collector is
tests/e2e/test_carrier_e2e.py."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from otel_helpers import children_of, providers, step_spans, tiny_loader, tiny_model

import otel_train
from otel_train import contract as c
from otel_train.handover import wire
from otel_train.processing.resolved import finished_step
from otel_train.recording.links import StepLink
from otel_train.runs import record_data
from otel_train.testing import InMemoryTelemetry


def _session(**settings: Any) -> InMemoryTelemetry:
    otel_train.testing.reset()
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", **settings, **providers(tel))
    return tel


def _ids(carrier: dict[str, str]) -> tuple[int, int, bool]:
    _, trace_id, span_id, flags = carrier["traceparent"].split("-")
    return int(trace_id, 16), int(span_id, 16), flags == "01"


def _count(tel: InMemoryTelemetry, phase: str) -> int:
    points = tel.points(c.PHASE_DURATION.name)
    return sum(p.count for p in points if p.attributes[c.A_PHASE] == phase)


def _generate(carriers: list[Any]) -> InMemoryTelemetry:
    """The generator: a rollout (with a nested generate) under each carrier."""
    tel = _session(trace_steps="sampled")
    for carrier in carriers:
        with otel_train.phase("rollout", parent=carrier), otel_train.phase("generate"):
            time.sleep(0.001)
    otel_train.shutdown()
    return tel


def test_a_remote_phase_is_a_child_of_the_trainers_step_in_its_trace() -> None:
    trainer = _session()
    carriers = []
    for k in range(3):
        with otel_train.step(samples=4):
            carriers.append(otel_train.carrier(policy_version=k))
            assert otel_train.carrier(policy_version=k) == carriers[-1]  # one step, one span
    otel_train.shutdown()
    assert [_ids(x)[2] for x in carriers] == [True, False, False]  # one a window, the first
    assert carriers[0]["baggage"] == "otel_train.step.index=0,otel_train.policy_version=0"
    step0 = step_spans(trainer.spans())[0]
    trace_id, span_id, _ = _ids(carriers[0])
    assert (step0.context.trace_id, step0.context.span_id) == (trace_id, span_id)

    generator = _generate(carriers)
    spans = generator.spans()
    (rollout,) = [s for s in spans if s.name == "rollout"]  # the sampled carrier's only
    (generate,) = [s for s in spans if s.name == "generate"]
    assert rollout.context.trace_id == trace_id and rollout.parent.span_id == span_id
    assert rollout.parent.is_remote
    assert generate.parent.span_id == rollout.context.span_id
    assert rollout.attributes[c.STEP_INDEX.key] == 0
    assert rollout.attributes[c.POLICY_VERSION.key] == 0
    assert not step_spans(spans)  # the generator opened no step of its own
    assert _count(generator, "rollout") == 3 and _count(generator, "generate") == 3
    assert not generator.points(c.STEPS.name) or all(
        p.value == 0 for p in generator.points(c.STEPS.name)
    )


def test_the_step_of_a_sampled_carrier_is_traced_whatever_its_time() -> None:
    tel = _session(trace_window=1000)
    carrier: dict[str, str] = {}
    for i in range(10):
        with otel_train.step():
            if i == 3:
                carrier = otel_train.carrier()
            if i == 7:
                time.sleep(0.02)  # the window's slowest
    otel_train.shutdown()
    traced = {s.attributes[c.STEP_INDEX.key]: s for s in step_spans(tel.spans())}
    assert sorted(traced) == [0, 3, 7]
    assert traced[3].attributes[c.STEP_SAMPLED_BECAUSE.key] == "carrier"
    assert traced[3].context.span_id == _ids(carrier)[1]
    assert traced[7].attributes[c.STEP_SAMPLED_BECAUSE.key] == "slowest"


def test_carriers_are_sampled_once_per_window_seconds_every_one_with_all() -> None:
    _session(trace_window_seconds=0.5)
    flags = []
    for pause in (0.0, 0.05, 0.6):
        time.sleep(pause)
        with otel_train.step():
            flags.append(_ids(otel_train.carrier())[2])
    assert flags == [True, False, True]
    _session(trace_steps="all")
    for _ in range(3):
        with otel_train.step():
            assert _ids(otel_train.carrier())[2]
    _session(trace_steps="none")  # no spans here: nothing under it is kept either
    with otel_train.step():
        assert not _ids(otel_train.carrier())[2]


def test_no_carrier_outside_a_step() -> None:
    assert otel_train.carrier() == {}  # no session
    _session()
    assert otel_train.carrier() == {}
    with otel_train.step():
        pass
    assert otel_train.carrier() == {}


def _sampled_carrier() -> dict[str, str]:
    _session()
    with otel_train.step():
        carrier = otel_train.carrier()
    otel_train.shutdown()
    return carrier


BAD = {
    "none": None,
    "empty": {},
    "malformed": {"traceparent": "00-xyz-abc-01"},
    "zero trace id": {"traceparent": f"00-{'0' * 32}-{'1' * 16}-01"},
    "not a mapping": 42,
}


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
def test_a_bad_carrier_gives_a_local_phase_and_one_warning(
    bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        tel = _generate([bad, bad])
    warned = [r for r in caplog.records if "parent=" in r.getMessage()]
    assert len(warned) == 1
    assert _count(tel, "rollout") == 2
    assert not [s for s in tel.spans() if s.name == "rollout" and s.parent is not None]


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
def test_a_bad_carrier_inside_a_step_gives_a_phase_of_that_step(
    bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """As if no parent= were given (issue 25 item 5): the rollout is a phase of the step
    open here, in its trace, with what nests in it; one warning saying so."""
    tel = _session(trace_steps="all")
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for _ in range(2):
            with (
                otel_train.step(),
                otel_train.phase("rollout", parent=bad),
                otel_train.phase("generate"),
            ):
                time.sleep(0.001)
    otel_train.shutdown()
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 2
    for step in steps:
        (rollout,) = [s for s in children_of(spans, step) if s.name == "rollout"]
        assert [s.name for s in children_of(spans, rollout)] == ["generate"]
    assert _count(tel, "rollout") == 2 and _count(tel, "generate") == 2
    warned = [r.getMessage() for r in caplog.records if "parent=" in r.getMessage()]
    assert len(warned) == 1 and "a phase of the step open here" in warned[0]


def test_a_bad_carrier_inside_a_step_gives_a_phase_of_it_through_the_sidecar(
    tmp_path: Path,
) -> None:
    """The same where the sidecar replays the log (its spans read from the run record)."""
    otel_train.configure(console="off", prometheus=False, trace_steps="all",
                         run_dir=str(tmp_path), service_name="bad-carrier")  # fmt: skip
    assert otel_train.session.current().feeder is not None  # (the sidecar runs)
    for bad in BAD.values():
        with otel_train.step(), otel_train.phase("rollout", parent=bad):
            time.sleep(0.001)
    assert otel_train.shutdown()
    (rank,) = record_data.load(next(tmp_path.iterdir()))
    steps = {s["spanId"] for s in rank.spans if s["name"] == c.STEP_SPAN.name}
    rollouts = [s for s in rank.spans if s["name"] == "rollout"]
    assert len(steps) == len(BAD) == len(rollouts)
    assert {s["parentSpanId"] for s in rollouts} == steps


def test_a_carrier_from_another_run_is_a_bad_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_TRAIN_RUN_ID", "run-a")
    carrier = _sampled_carrier()
    assert "otel_train.job=run-a" in carrier["baggage"]
    monkeypatch.setenv("OTEL_TRAIN_RUN_ID", "run-b")
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        tel = _generate([carrier])
    assert any("another run" in r.getMessage() for r in caplog.records)
    assert _count(tel, "rollout") == 1 and not tel.spans()
    monkeypatch.setenv("OTEL_TRAIN_RUN_ID", "run-a")
    assert len([s for s in _generate([carrier]).spans() if s.name == "rollout"]) == 1


def test_a_step_with_a_parent_joins_the_trace_and_hands_it_on() -> None:
    carrier = _sampled_carrier()
    trace_id, span_id, _ = _ids(carrier)
    tel = _session()
    with otel_train.step():
        pass  # the first step: traced anyway
    with otel_train.step(parent=carrier):
        onward = otel_train.carrier()
    otel_train.shutdown()
    joined = step_spans(tel.spans())[1]
    assert joined.context.trace_id == trace_id and joined.parent.span_id == span_id
    assert joined.attributes[c.STEP_SAMPLED_BECAUSE.key] == "parent"
    assert _ids(onward) == (trace_id, joined.context.span_id, True)  # the chain goes on


def test_remote_phases_in_a_plain_loop_and_an_instrumented_generator() -> None:
    """The trainer is a plain instrumented loop (its hooks deferred, applied later):
    the carrier of a step inside it names that step's span. The generator calls its
    instrumented policy inside the remote phase: forward nests under rollout."""
    trainer = _session()
    model, opt = tiny_model()
    inst = otel_train.instrument(model, optimizer=opt, dataloader=tiny_loader())
    carriers = []
    for x, y in tiny_loader():
        loss = ((model(x) - y) ** 2).mean()
        carriers.append(otel_train.carrier())
        opt.zero_grad()
        loss.backward()
        opt.step()
    inst.uninstrument()
    otel_train.shutdown()
    steps = step_spans(trainer.spans())
    assert steps[0].context.span_id == _ids(carriers[0])[1]
    assert {p.value for p in trainer.points(c.STEPS.name)} == {4}

    generator = _session()
    policy, policy_opt = tiny_model()
    otel_train.instrument(policy, optimizer=policy_opt)
    with otel_train.phase("rollout", parent=carriers[0]):
        policy(next(iter(tiny_loader()))[0])
    otel_train.shutdown()
    spans = generator.spans()
    (rollout,) = [s for s in spans if s.name == "rollout"]
    (forward,) = [s for s in spans if s.name == "forward"]
    assert forward.parent.span_id == rollout.context.span_id
    assert rollout.parent.span_id == steps[0].context.span_id


def test_links_cross_the_sidecar_pipe() -> None:
    step = finished_step(-1, 10, 20)
    step.link = StepLink(7, 0, 9, True, 3, 2)
    ((part,),) = wire.FrameReader().feed(wire.FrameWriter().frame(([step],)))
    assert isinstance(part, list) and part[0].index == -1 and part[0].link == step.link
