"""Off-policy links (issue 15): a remote phase's token, consumed by a later trainer step,
links that step's span to the rollout's span, records the policy staleness and shows the
rollout's figures in the trainer's console. One process at a time, as in
test_carrier.py; the real processes are tests/e2e/test_carrier_e2e.py and
tests/e2e/test_ray_e2e.py."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from otel_helpers import providers, step_spans

import otel_train
from otel_train import contract as c
from otel_train.handover import wire
from otel_train.processing.resolved import finished_step
from otel_train.recording.tokens import MAX_CONSUMED, MAX_PRODUCED, Consumed
from otel_train.testing import InMemoryTelemetry


def _session(**settings: Any) -> InMemoryTelemetry:
    otel_train.testing.reset()
    tel = InMemoryTelemetry()
    settings.setdefault("console", "off")
    otel_train.configure(**settings, **providers(tel))
    return tel


def _carriers(n: int, **settings: Any) -> list[dict[str, str]]:
    """The trainer's first ``n`` steps hand out carriers at policy versions 0 .. n-1."""
    _session(**settings)
    out = []
    for k in range(n):
        with otel_train.step():
            out.append(otel_train.carrier(policy_version=k))
    otel_train.shutdown()
    return out


def _rollouts(carriers: list[Any]) -> tuple[InMemoryTelemetry, list[dict[str, str]]]:
    """The generator (role generator): a rollout under each carrier, and its token."""
    tel = _session(role="generator")
    tokens = []
    for carrier in carriers:
        with otel_train.phase("rollout", parent=carrier) as rollout:
            time.sleep(0.01)
        tokens.append(rollout.produced())
    otel_train.shutdown()
    return tel, tokens


def _span_id(traceparent: str) -> int:
    return int(traceparent.split("-")[2], 16)


def test_the_consuming_step_links_to_the_producing_rollout_and_records_staleness() -> None:
    carriers = _carriers(3)  # only the first is sampled (one carrier per window)
    generator, tokens = _rollouts(carriers)
    (rollout,) = [s for s in generator.spans() if s.name == "rollout"]
    assert _span_id(tokens[0]["traceparent"]) == rollout.context.span_id  # known before
    assert tokens[0]["traceparent"].endswith("-01") and tokens[1]["traceparent"].endswith("-00")
    assert tokens[0][c.RESOURCE_ROLE.key] == "generator"
    assert float(tokens[0][c.PHASE_HOST_DURATION.key]) >= 0.01

    trainer = _session()
    with otel_train.step():  # the first step: traced for being first, it links nothing
        pass
    for j, token in zip((5, 6, 9), (tokens[1], tokens[0], tokens[2]), strict=True):
        with otel_train.step():  # (consumed out of order: off-policy)
            otel_train.consumed(token, policy_version=j)
    otel_train.shutdown()
    steps = {s.attributes[c.STEP_INDEX.key]: s for s in step_spans(trainer.spans())}
    assert 1 not in steps  # it consumed a rollout whose span does not exist
    reasons = {i: s.attributes[c.STEP_SAMPLED_BECAUSE.key] for i, s in steps.items()}
    assert reasons[2] == "consumed" and list(reasons.values()).count("consumed") == 1
    consuming = steps[2]
    (link,) = consuming.links
    assert (link.context.trace_id, link.context.span_id) == (
        rollout.context.trace_id,
        rollout.context.span_id,
    )
    assert link.attributes[c.POLICY_VERSION.key] == 0
    assert link.attributes[c.LINK_STALENESS.key] == 6
    assert link.attributes[c.PHASE_NAME.key] == "rollout"
    (point,) = trainer.points(c.POLICY_STALENESS.name)
    assert (point.count, point.sum) == (3, (5 - 1) + (6 - 0) + (9 - 2))
    assert list(point.explicit_bounds) == list(c.STALENESS_BUCKETS)


def test_the_trainers_table_and_summary_show_the_generators_rollouts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, tokens = _rollouts(_carriers(4))
    seconds = [float(t[c.PHASE_HOST_DURATION.key]) for t in tokens]
    capsys.readouterr()
    _session(console="stdout", console_every=2)
    for j, token in enumerate(tokens):
        with otel_train.step(), otel_train.phase("train"):
            otel_train.consumed(token, policy_version=j)
    otel_train.shutdown()
    out = capsys.readouterr().out
    tables = [t for t in out.split("otel-train  steps ")[1:]]
    assert len(tables) == 2
    row = next(line for line in tables[0].splitlines() if line.startswith("rollout [generator]"))
    per_step = f"{(seconds[0] + seconds[1]) / 2 * 1e3:.2f} ms"
    assert row.split()[2:5] == [*per_step.split(), "-"]  # no share of the trainer's step
    summary = out.split("run summary:")[1]
    row = next(line for line in summary.splitlines() if line.startswith("rollout [generator]"))
    assert row.split()[4:6] == ["-", "4"]  # calls: every consumed rollout
    assert next(line for line in summary.splitlines() if line.startswith("train"))


def test_a_rollout_under_a_bad_carrier_hands_back_figures_only() -> None:
    _, (token,) = _rollouts([None])
    assert "traceparent" not in token and float(token[c.PHASE_HOST_DURATION.key]) > 0
    trainer = _session(trace_steps="all")
    with otel_train.step():
        otel_train.consumed(token, policy_version=3)
    otel_train.shutdown()
    (step,) = step_spans(trainer.spans())
    assert not step.links and not trainer.points(c.POLICY_STALENESS.name)


def test_a_token_taken_inside_the_phase_names_its_span_without_figures() -> None:
    (carrier,) = _carriers(1)
    generator = _session()
    with otel_train.phase("rollout", parent=carrier) as rollout:
        early = rollout.produced(policy_version=7)  # (the weights this process used)
    otel_train.shutdown()
    (span,) = [s for s in generator.spans() if s.name == "rollout"]
    assert _span_id(early["traceparent"]) == span.context.span_id
    assert "otel_train.policy_version=7" in early["baggage"]
    assert c.PHASE_HOST_DURATION.key not in early


BAD = {
    "none": None,
    "empty": {},
    "a string": "rollout",
    "no phase name": {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"},
    "malformed traceparent": {"traceparent": "00-xyz-01", c.PHASE_NAME.key: "rollout"},
}


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
def test_a_bad_token_warns_once_and_the_step_is_recorded(
    bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tel = _session(trace_steps="all")
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for _ in range(2):
            with otel_train.step():
                otel_train.consumed(bad, policy_version=1)
    otel_train.shutdown()
    warned = [r for r in caplog.records if "consumed()" in r.getMessage()]
    assert len(warned) == 1
    assert [len(s.links) for s in step_spans(tel.spans())] == [0, 0]
    assert not tel.points(c.POLICY_STALENESS.name)


def test_a_token_from_another_run_or_outside_a_step_is_a_bad_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_TRAIN_RUN_ID", "run-a")
    _, (token,) = _rollouts(_carriers(1))
    monkeypatch.setenv("OTEL_TRAIN_RUN_ID", "run-b")
    _session()
    with caplog.at_level(logging.WARNING, logger="otel_train"), otel_train.step():
        otel_train.consumed(token, policy_version=1)
    assert any("another run" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("OTEL_TRAIN_RUN_ID", "run-a")
    caplog.clear()
    _session()
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        otel_train.consumed(token, policy_version=1)
    assert any("outside any step" in r.getMessage() for r in caplog.records)
    otel_train.shutdown()
    otel_train.consumed(token)  # no session: nothing, no error


def test_what_waits_for_tokens_is_bounded() -> None:
    _session()
    rec = otel_train.session.current().recorder
    for _ in range(MAX_PRODUCED + 50):  # tokens never asked for
        with otel_train.phase("rollout", parent=None):
            pass
    rec.settle()
    assert len(rec.produced_figures) == MAX_PRODUCED
    token = {c.PHASE_NAME.key: "rollout", c.PHASE_HOST_DURATION.key: "0.5"}
    with otel_train.step():
        for _ in range(MAX_CONSUMED + 50):
            otel_train.consumed(token)
        assert len(rec.current_step.consumed) == MAX_CONSUMED
    otel_train.shutdown()


def test_consumed_rollouts_cross_the_sidecar_pipe() -> None:
    step = finished_step(4, 10, 20)
    step.consumed = [Consumed(7, 9, True, "rollout", "generator", 0.5, 10, 100, 2, 3)]
    ((part,),) = wire.FrameReader().feed(wire.FrameWriter().frame(([step],)))
    assert isinstance(part, list) and part[0].consumed == step.consumed
