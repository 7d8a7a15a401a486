"""Telemetry never gets in the way of training: internal errors, shutdown deadlines, forks."""

from __future__ import annotations

import contextlib
import io
import logging
import time

import pytest
import torch
from otel_helpers import (
    children_of,
    providers,
    step_spans,
    tiny_loader,
    tiny_model,
    train_epoch,
    value,
)

import otel_train
from otel_train import contract as c
from otel_train.recording import recorder as recorder_module
from otel_train.recording.recorder import Recorder
from otel_train.testing import InMemoryTelemetry

QUIET = {"console": "off", "trace_steps": "all"}


def _broken(*args: object) -> list:
    raise RuntimeError("recorder bug")


# Recorder internals every entry point goes through: the clock of the hot path, and the
# per-thread phase stack behind the adapters' inferred boundaries.
BREAKABLE = [(recorder_module, "perf_counter_ns"), (Recorder, "_close")]


def _internal_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "otel_train" and r.levelno >= logging.ERROR]


def test_internal_error_in_explicit_phases_is_logged_once_and_disables_recording(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tel = InMemoryTelemetry()
    session = otel_train.configure(**QUIET, **providers(tel))
    with otel_train.step(samples=1), otel_train.phase("a"):  # a good step before the failure
        pass
    monkeypatch.setattr(recorder_module, "perf_counter_ns", _broken)
    boom = ValueError("user error")
    with caplog.at_level(logging.ERROR, logger="otel_train"):
        for _ in range(5):
            with otel_train.step(samples=1), otel_train.phase("a"), otel_train.phase("b"):
                pass
        # User errors still pass through unchanged.
        with pytest.raises(ValueError) as raised, otel_train.step(), otel_train.phase("a"):
            raise boom
        assert raised.value is boom
        otel_train.record(loss=1.0)
    errors = _internal_errors(caplog)
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "recording disabled" in errors[0].getMessage()
    assert errors[0].exc_info is not None and str(errors[0].exc_info[1]) == "recorder bug"
    assert session.recorder.enabled is False
    monkeypatch.undo()
    otel_train.shutdown()
    assert len(step_spans(tel.spans())) == 1  # the good step before the failure


@pytest.mark.parametrize(("owner", "attr"), BREAKABLE, ids=["clock", "close"])
def test_internal_error_in_the_plain_loop_never_reaches_training(
    owner: object, attr: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader()
    otel_train.instrument(model, optimizer=opt, dataloader=loader, **QUIET, **providers(tel))
    session = otel_train.session.current()
    monkeypatch.setattr(owner, attr, _broken)
    before = [p.detach().clone() for p in model.parameters()]
    with caplog.at_level(logging.ERROR, logger="otel_train"):
        losses = train_epoch(model, opt, loader)
        losses += train_epoch(model, opt, loader)
    assert len(losses) == 8
    after = list(model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))  # it trained
    errors = _internal_errors(caplog)
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert session.recorder.enabled is False


def test_internal_error_in_the_method_adapter_never_reaches_the_loop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Loop:
        def generate(self) -> int:
            return 3

        def run(self) -> int:
            return self.generate() + 1

    loop = Loop()
    otel_train.instrument(
        loop, phases={"rollout": "generate"}, step="run", **QUIET, **providers(InMemoryTelemetry())
    )
    monkeypatch.setattr(recorder_module, "perf_counter_ns", _broken)
    with caplog.at_level(logging.ERROR, logger="otel_train"):
        assert [loop.run() for _ in range(3)] == [4, 4, 4]
    assert len(_internal_errors(caplog)) == 1


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_shutdown_returns_within_its_deadline_with_the_collector_unreachable(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ):
        monkeypatch.delenv(var, raising=False)
    model, opt = tiny_model()
    loader = tiny_loader()
    otel_train.instrument(
        model,
        optimizer=opt,
        dataloader=loader,
        otlp_endpoint="http://127.0.0.1:1",
        otlp_protocol=protocol,
        prometheus=False,
        metric_export_interval=0.2,
        **QUIET,
    )
    train_epoch(model, opt, loader)
    t0 = time.monotonic()
    otel_train.shutdown(timeout=1.0)
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0


def test_shutdown_is_idempotent_and_safe_without_a_session() -> None:
    assert otel_train.shutdown() is True
    otel_train.configure(**QUIET, **providers(InMemoryTelemetry()))
    assert otel_train.shutdown() is True
    assert otel_train.shutdown() is True
    assert otel_train.session.current() is None


class ForkProbe(torch.utils.data.Dataset):
    """Reports, from inside each DataLoader worker, what otel-train looks like there."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from otel_train import session

        with otel_train.phase("in_worker"):  # must be a no-op in a forked child
            otel_train.record(in_worker=1.0)
        info = torch.utils.data.get_worker_info()
        in_child = info is not None
        quiet = session.forked_child and session.current() is None
        return torch.randn(8), torch.randn(1), torch.tensor([in_child, quiet])


# Python 3.12+ warns on any fork of a threaded process; forking workers is the point here.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_dataloader_with_forked_workers_neither_hangs_nor_exports_from_children() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = torch.utils.data.DataLoader(
        ForkProbe(),
        batch_size=8,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=30,  # a hung worker fails the test instead of hanging the suite
    )
    otel_train.instrument(model, optimizer=opt, dataloader=loader, **QUIET, **providers(tel))
    flags = []
    for _ in range(2):
        for x, y, probe in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            flags.append(probe)
    otel_train.shutdown()
    probe = torch.cat(flags)
    assert probe.shape == (64, 2)
    assert probe[:, 0].all()  # every item came from a worker process
    assert probe[:, 1].all()  # and there otel-train had no session and was switched off

    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 8
    assert "in_worker" not in {s.name for s in spans}
    for s in steps:
        assert [k.name for k in children_of(spans, s)] == [
            "data",
            "forward",
            "backward",
            "optimizer",
        ]
        assert s.attributes[c.STEP_SAMPLES.key] == 8
    assert {p.attributes.get("name") for p in tel.points(c.SCALAR.name)} <= {None}


def test_phase_names_beyond_the_cap_share_one_series() -> None:
    from otel_train.processing import phase_series

    tel = InMemoryTelemetry()
    otel_train.configure(console="off", **providers(tel))
    n = phase_series.MAX_PHASE_SERIES + 50
    for i in range(n):
        with otel_train.step(), otel_train.phase(f"phase-{i}"):
            pass
    otel_train.shutdown()
    points = tel.points(c.PHASE_DURATION.name)
    names = {p.attributes[c.A_PHASE] for p in points}
    assert len(names) == phase_series.MAX_PHASE_SERIES + 1
    other = [p for p in points if p.attributes[c.A_PHASE] == phase_series.OTHER_PHASE]
    assert sum(p.count for p in other) == n - phase_series.MAX_PHASE_SERIES


def test_a_phase_ending_after_its_step_is_counted_as_dropped() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", **providers(tel))
    scope = otel_train.phase("late")
    with otel_train.step():
        scope.__enter__()
    scope.__exit__(None, None, None)  # the step ended first: this phase cannot be kept
    otel_train.shutdown()
    (point,) = [p for p in tel.points(c.DROPPED.name) if p.attributes[c.A_REASON] == "late_phase"]
    assert point.value == 1
    assert [s.name for s in tel.spans()] == [c.STEP_SPAN.name]


def test_user_scalar_names_are_bounded_and_the_rest_counted() -> None:
    from otel_train.recording.recorder import MAX_SCALAR_NAMES

    tel = InMemoryTelemetry()
    otel_train.configure(console="off", **providers(tel))
    extra = 7
    for i in range(MAX_SCALAR_NAMES + extra):
        otel_train.record(**{f"metric_{i}": float(i)})
    otel_train.record(metric_0=-1.0)  # a known name still updates past the cap
    otel_train.shutdown()
    values = {p.attributes[c.A_NAME]: p.value for p in tel.points(c.SCALAR.name)}
    assert len(values) == MAX_SCALAR_NAMES
    assert values["metric_0"] == -1.0
    (dropped,) = [
        p for p in tel.points(c.DROPPED.name) if p.attributes[c.A_REASON] == "scalar_names"
    ]
    assert dropped.value == extra


def test_a_console_that_cannot_print_switches_off_and_metrics_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader()
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="stdout",
                          console_every=1, sidecar="off", **providers(tel))  # fmt: skip
    session = otel_train.session.current()
    assert session is not None
    closed = io.StringIO()
    closed.close()  # printing to it raises ValueError, on the worker's thread
    with caplog.at_level(logging.ERROR, logger="otel_train"), contextlib.redirect_stdout(closed):
        train_epoch(model, opt, loader)
        session.worker.process()
        train_epoch(model, opt, loader)
        otel_train.shutdown()
    failed = [r for r in caplog.records if "console table failed" in r.getMessage()]
    assert len(failed) == 1
    assert session.worker.console.stream is None
    assert value(tel, c.STEPS.name) == 8  # every step still counted


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def test_a_name_whose_str_raises_is_logged_once_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """phase(obj) with an object whose str() raises: the phase is kept as 'unnamed',
    one warning says why, and nothing reaches the loop."""
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", **providers(tel))
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for _ in range(3):
            with otel_train.step(samples=1), otel_train.phase(_Unprintable()):  # type: ignore[arg-type]
                pass
    otel_train.shutdown()
    names = {s.name for s in tel.spans()}
    assert names == {c.STEP_SPAN.name, "unnamed"}
    said = [r for r in caplog.records if r.name == "otel_train" and "str()" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert "RuntimeError" in said[0].getMessage()
