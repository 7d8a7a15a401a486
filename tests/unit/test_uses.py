"""The three ways to use otel-train, checked end to end against the in-memory SDK exporter
and reader: span tree, names, attributes and metric values."""

from __future__ import annotations

import time

import pytest
import torch
from opentelemetry.trace import StatusCode
from otel_helpers import (
    children_of,
    names,
    phase_counts,
    providers,
    step_spans,
    tiny_loader,
    tiny_model,
    train_epoch,
    value,
)

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

QUIET = {"console": "off", "trace_steps": "all"}


def check_tree(step: object, kids: list, expected: list[str]) -> None:
    """Phases are children of the step: same trace, parent id = step span id, inside its time."""
    assert names(kids) == expected
    for k in kids:
        assert k.context.trace_id == step.context.trace_id
        assert k.parent.span_id == step.context.span_id
        assert k.attributes[c.PHASE_NAME.key] == k.name
        assert k.attributes[c.STEP_INDEX.key] == step.attributes[c.STEP_INDEX.key]
        assert k.attributes[c.PHASE_CLOCK.key] in ("host", "device")
        assert k.attributes[c.PHASE_HOST_DURATION.key] > 0
        assert step.start_time <= k.start_time <= k.end_time <= step.end_time


# -- 1. a plain PyTorch loop -----------------------------------------------------------------


def test_plain_loop_spans_and_metrics() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=32, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, **QUIET, **providers(tel))
    losses = train_epoch(model, opt, loader, record=True)
    assert otel_train.shutdown()

    spans = tel.spans()
    steps = step_spans(spans)
    assert [s.attributes[c.STEP_INDEX.key] for s in steps] == [0, 1, 2, 3]
    for s in steps:
        assert s.parent is None  # each step is the root of its own trace
        assert s.attributes[c.STEP_SAMPLES.key] == 8
        assert c.STEP_TOKENS.key not in s.attributes  # tuples of tensors carry no token count
        assert s.attributes[c.RANK.key] == 0
        assert s.attributes[c.STEP_SAMPLED_BECAUSE.key] == "all"
        host = s.attributes[c.STEP_HOST_DURATION.key]
        assert 0 < host <= (s.end_time - s.start_time) / 1e9 + 1e-6
        assert s.attributes[c.STEP_THROUGHPUT_SAMPLES.key] == pytest.approx(8 / host)
        kids = children_of(spans, s)
        check_tree(s, kids, ["data", "forward", "backward", "optimizer"])
        for k in kids:
            assert k.attributes[c.PHASE_HOST_DURATION.key] <= host
    assert len(spans) == 4 * 5  # nothing else: no stray step from the exhausted loader

    assert value(tel, c.STEPS.name) == 4
    assert value(tel, c.SAMPLES.name) == 32
    assert value(tel, c.TOKENS.name) is None
    assert phase_counts(tel) == {"data": 4, "forward": 4, "backward": 4, "optimizer": 4}
    (step_hist,) = tel.points(c.STEP_DURATION.name)
    assert step_hist.count == 4
    assert step_hist.sum == pytest.approx(
        sum(s.attributes[c.STEP_HOST_DURATION.key] for s in steps), rel=1e-6
    )
    assert value(tel, c.SCALAR.name, name="loss") == pytest.approx(losses[-1])


def test_plain_loop_gradient_accumulation() -> None:
    """Two micro-batches per optimizer step: one step with two data/forward/backward rounds."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=32, batch_size=4)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, **QUIET, **providers(tel))
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y) / 2
        loss.backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
    otel_train.shutdown()

    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 4
    for s in steps:
        assert s.attributes[c.STEP_SAMPLES.key] == 8  # both micro-batches
        check_tree(
            s,
            children_of(spans, s),
            ["data", "forward", "backward", "data", "forward", "backward", "optimizer"],
        )
    assert value(tel, c.STEPS.name) == 4
    assert value(tel, c.SAMPLES.name) == 32
    assert phase_counts(tel) == {"data": 8, "forward": 8, "backward": 8, "optimizer": 4}


def test_plain_loop_without_dataloader_counts_model_inputs() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel))
    for _ in range(3):
        loss = model(torch.randn(5, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():  # evaluation is not a training step
        model.eval()
        model(torch.randn(5, 8))
    otel_train.shutdown()
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 3
    for s in steps:
        assert s.attributes[c.STEP_SAMPLES.key] == 5
        check_tree(s, children_of(spans, s), ["forward", "backward", "optimizer"])
    assert value(tel, c.SAMPLES.name) == 15


def test_explicit_phase_inside_plain_loop_keeps_the_stack_balanced() -> None:
    """An explicit phase around the model call ends the adapter's inferred forward with it."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel))
    rec = otel_train.session.current().recorder
    for _ in range(3):
        with otel_train.step(samples=10):  # the user's count stands; model inputs don't add
            with otel_train.phase("policy"):
                loss = model(torch.randn(4, 8)).sum()
            loss.backward()
            opt.step()
        assert rec.open_phase_names() == []
    otel_train.shutdown()
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 3
    for s in steps:
        kids = children_of(spans, s)
        check_tree(s, kids, ["policy", "backward", "optimizer"])
        assert names(children_of(spans, kids[0])) == ["forward"]
        assert s.attributes[c.STEP_SAMPLES.key] == 10
    assert phase_counts(tel) == {"policy": 3, "forward": 3, "backward": 3, "optimizer": 3}
    assert value(tel, c.SAMPLES.name) == 30


# -- 2. an object whose methods are the phases (the RL-loop shape) --------------------------


class RLLoop:
    def __init__(self) -> None:
        self.policy = torch.nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.policy.parameters(), lr=0.1)
        self.version = 0

    def generate(self, n: int) -> torch.Tensor:
        return torch.randn(n, 4)

    def train_step(self, rollouts: torch.Tensor) -> torch.Tensor:
        loss = self.policy(rollouts).pow(2).mean()
        loss.backward()
        return loss.detach()

    def optim_step(self) -> None:
        self.opt.step()
        self.opt.zero_grad()

    def sync_weights(self) -> int:
        self.version += 1
        return self.version

    def run_iteration(self, n: int = 8) -> tuple[torch.Tensor, int]:
        rollouts = self.generate(n)
        loss = self.train_step(rollouts)
        self.optim_step()
        version = self.sync_weights()
        otel_train.record(loss=loss, reward=float(n))
        return loss, version


RL_PHASES = {
    "rollout": "generate",
    "train": "train_step",
    "optimizer": "optim_step",
    "weight_sync": "sync_weights",
}


def test_method_map_rl_loop() -> None:
    tel = InMemoryTelemetry()
    loop = RLLoop()
    inst = otel_train.instrument(
        loop, phases=RL_PHASES, step="run_iteration", **QUIET, **providers(tel)
    )
    assert isinstance(inst, otel_train.Instrumentation)
    results = [loop.run_iteration() for _ in range(3)]
    assert [v for _, v in results] == [1, 2, 3]  # return values pass through unchanged
    otel_train.shutdown()

    spans = tel.spans()
    steps = step_spans(spans)
    assert [s.attributes[c.STEP_INDEX.key] for s in steps] == [0, 1, 2]
    for s in steps:
        assert s.parent is None
        assert s.attributes[c.RANK.key] == 0
        assert s.attributes[c.STEP_HOST_DURATION.key] > 0
        assert c.STEP_SAMPLES.key not in s.attributes  # unknown, so absent
        check_tree(s, children_of(spans, s), ["rollout", "train", "optimizer", "weight_sync"])
    assert len(spans) == 3 * 5
    assert value(tel, c.STEPS.name) == 3
    assert phase_counts(tel) == {"rollout": 3, "train": 3, "optimizer": 3, "weight_sync": 3}
    assert value(tel, c.SCALAR.name, name="loss") == pytest.approx(float(results[-1][0]))
    assert value(tel, c.SCALAR.name, name="reward") == 8.0


def test_method_map_without_step_closes_a_step_when_a_phase_repeats() -> None:
    tel = InMemoryTelemetry()
    loop = RLLoop()
    otel_train.instrument(loop, phases=RL_PHASES, **QUIET, **providers(tel))
    for _ in range(3):
        loop.train_step(loop.generate(4))
        loop.optim_step()
    otel_train.shutdown()
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 3
    for s in steps:
        check_tree(s, children_of(spans, s), ["rollout", "train", "optimizer"])
    assert value(tel, c.STEPS.name) == 3


# -- 3. explicit regions ------------------------------------------------------------------------


def test_explicit_step_and_nested_phases() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(**QUIET, **providers(tel))
    for i in range(3):
        with otel_train.step(samples=64, tokens=64 * 512):
            with otel_train.phase("rollout"):
                with otel_train.phase("generate"):
                    time.sleep(0.003)
                with otel_train.phase("score"):
                    pass
            with otel_train.phase("train"):
                with otel_train.phase("forward"), otel_train.phase("attention"):
                    pass
                with otel_train.phase("backward"):
                    pass
            otel_train.record(loss=1.0 / (i + 1))
    otel_train.shutdown()

    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 3
    assert len({s.context.trace_id for s in steps}) == 3  # one trace per step
    for s in steps:
        assert s.parent is None
        assert s.attributes[c.STEP_SAMPLES.key] == 64
        assert s.attributes[c.STEP_TOKENS.key] == 64 * 512
        assert s.attributes[c.RANK.key] == 0
        host = s.attributes[c.STEP_HOST_DURATION.key]
        assert host >= 0.003
        assert s.attributes[c.STEP_THROUGHPUT_TOKENS.key] == pytest.approx(64 * 512 / host)
        rollout, train = top = children_of(spans, s)
        check_tree(s, top, ["rollout", "train"])
        generate, score = children_of(spans, rollout)
        assert names([generate, score]) == ["generate", "score"]
        forward, backward = children_of(spans, train)
        assert names([forward, backward]) == ["forward", "backward"]
        (attention,) = children_of(spans, forward)
        assert attention.name == "attention"
        for parent, child in [
            (rollout, generate),
            (rollout, score),
            (train, forward),
            (train, backward),
            (forward, attention),
        ]:
            assert child.parent.span_id == parent.context.span_id
            assert child.context.trace_id == s.context.trace_id
            assert parent.start_time <= child.start_time <= child.end_time <= parent.end_time
        assert generate.attributes[c.PHASE_HOST_DURATION.key] >= 0.003
        assert (
            rollout.attributes[c.PHASE_HOST_DURATION.key]
            >= (generate.attributes[c.PHASE_HOST_DURATION.key])
        )
    assert len(spans) == 3 * 8

    assert value(tel, c.STEPS.name) == 3
    assert value(tel, c.SAMPLES.name) == 3 * 64
    assert value(tel, c.TOKENS.name) == 3 * 64 * 512
    assert phase_counts(tel) == {
        n: 3 for n in ("rollout", "generate", "score", "train", "forward", "attention", "backward")
    }
    (gen,) = [p for p in tel.points(c.PHASE_DURATION.name) if p.attributes["phase"] == "generate"]
    assert gen.sum >= 3 * 0.003
    assert dict(gen.attributes) == {"phase": "generate", "clock": "host"}
    assert value(tel, c.SCALAR.name, name="loss") == pytest.approx(1 / 3)


def test_nested_explicit_step_does_not_end_the_outer_one() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(**QUIET, **providers(tel))
    with otel_train.step(samples=8):
        with otel_train.phase("a"):
            pass
        with otel_train.step(samples=2), otel_train.phase("b"):
            pass
        with otel_train.phase("c"):
            pass
    otel_train.shutdown()
    spans = tel.spans()
    (s,) = step_spans(spans)
    check_tree(s, children_of(spans, s), ["a", "b", "c"])
    assert s.attributes[c.STEP_SAMPLES.key] == 8


def test_bare_phases_without_step_become_steps_when_the_cycle_repeats() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(**QUIET, **providers(tel))
    for _ in range(3):
        with otel_train.phase("rollout"):
            pass
        with otel_train.phase("train"):
            pass
    otel_train.shutdown()
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 3
    for s in steps:
        check_tree(s, children_of(spans, s), ["rollout", "train"])


def test_phase_error_marks_span_and_reaches_the_user_unchanged() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(**QUIET, **providers(tel))
    boom = ValueError("bad batch 7")
    with pytest.raises(ValueError) as raised, otel_train.step(samples=1):
        with otel_train.phase("ok"):
            pass
        with otel_train.phase("train"):
            raise boom
    assert raised.value is boom
    assert raised.value.args == ("bad batch 7",)
    otel_train.shutdown()
    spans = tel.spans()
    (s,) = step_spans(spans)
    ok, train = children_of(spans, s)
    assert train.status.status_code == StatusCode.ERROR
    assert "bad batch 7" in train.status.description
    (event,) = [e for e in train.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "bad batch 7"
    assert "raise boom" in event.attributes["exception.stacktrace"]
    assert ok.status.status_code == StatusCode.UNSET
    assert not ok.events
    assert s.status.status_code == StatusCode.ERROR
    assert s.attributes[c.STEP_SAMPLED_BECAUSE.key] == "all"


def test_error_in_method_phase_reaches_the_user_unchanged() -> None:
    tel = InMemoryTelemetry()

    class Loop:
        def __init__(self) -> None:
            self.err = KeyError("rollout worker lost")

        def generate(self) -> None:
            raise self.err

        def run(self) -> None:
            self.generate()

    loop = Loop()
    otel_train.instrument(
        loop, phases={"rollout": "generate"}, step="run", **QUIET, **providers(tel)
    )
    with pytest.raises(KeyError) as raised:
        loop.run()
    assert raised.value is loop.err
    otel_train.shutdown()
    spans = tel.spans()
    (s,) = step_spans(spans)
    (rollout,) = children_of(spans, s)
    assert rollout.status.status_code == StatusCode.ERROR
    assert [e.name for e in rollout.events] == ["exception"]
    assert rollout.events[0].attributes["exception.type"] == "KeyError"


def test_error_in_backward_marks_the_backward_phase() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel))
    model(torch.randn(2, 8))
    no_grad = torch.ones(2)  # does not require grad: backward raises
    with pytest.raises(RuntimeError, match="does not require grad") as raised:
        no_grad.sum().backward()
    err = raised.value
    otel_train.shutdown()
    spans = tel.spans()
    (s,) = step_spans(spans)
    forward, backward = children_of(spans, s)
    assert (forward.name, backward.name) == ("forward", "backward")
    assert backward.status.status_code == StatusCode.ERROR
    (event,) = backward.events
    assert event.name == "exception"
    assert event.attributes["exception.message"] == str(err)


class _Fails(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise ValueError("bad batch")
        return self.lin(x)


def test_error_in_model_forward_marks_the_forward_phase() -> None:
    tel = InMemoryTelemetry()
    model = _Fails()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel))
    model.fail = True
    with pytest.raises(ValueError, match="bad batch") as raised:
        model(torch.randn(2, 8))
    model.fail = False
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    otel_train.shutdown()
    spans = tel.spans()
    (s,) = step_spans(spans)
    kids = children_of(spans, s)
    assert names(kids) == ["forward", "forward", "backward", "optimizer"]
    failed, ok = kids[0], kids[1]
    assert failed.status.status_code == StatusCode.ERROR
    (event,) = failed.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == str(raised.value)
    assert ok.status.status_code == StatusCode.UNSET
    assert s.status.status_code == StatusCode.ERROR


@pytest.mark.parametrize(("given", "expected"), [(5, 5), (None, 8)])
def test_explicit_step_around_an_instrumented_loader_adopts_the_fetch(
    given: int | None, expected: int
) -> None:
    """``for batch in loader: with step():`` gives one step per batch, the fetch included."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=32, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, **QUIET, **providers(tel))
    for x, y in loader:
        with otel_train.step(samples=given):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    otel_train.shutdown()
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 4
    for s in steps:
        assert s.attributes[c.STEP_SAMPLES.key] == expected
        check_tree(s, children_of(spans, s), ["data", "forward", "backward", "optimizer"])
    assert value(tel, c.STEPS.name) == 4
    assert value(tel, c.SAMPLES.name) == 4 * expected
