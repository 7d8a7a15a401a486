"""Bare calls before the first instrument() or configure() (issue 25 item 4): a
``record()``, ``step()`` or ``phase()`` starts a session whose exports wait, and the
first call that names settings configures it; what the early calls recorded is kept.
No error and no warning, unless the session had begun exporting (then it restarts with
the new settings and one warning) or a setting the recorder measures with changed."""

from __future__ import annotations

import logging
import re
import socket
from pathlib import Path

import pytest
from otel_helpers import attached, providers, tiny_loader, tiny_model, train_epoch, value

import otel_train
from otel_train import contract as c
from otel_train.recording.recorder import BUILT_WITH
from otel_train.testing import InMemoryTelemetry

RECORDING = Path(otel_train.__file__).parent / "recording"


@pytest.fixture(autouse=True)
def _no_default_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults of the bare calls' sessions without /metrics: its default port may
    be taken on a shared machine (the last test here holds one on purpose)."""
    monkeypatch.setenv("OTEL_TRAIN_PROMETHEUS", "false")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_record_before_instrument_lets_instrument_configure_and_is_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        otel_train.record(lr=0.25)
        otel_train.instrument(model, optimizer=opt, dataloader=tiny_loader(),
                              console_every=0, console="off", **providers(tel))  # fmt: skip
        train_epoch(model, opt, tiny_loader())
        otel_train.shutdown()
    assert _warnings(caplog) == []
    assert value(tel, c.SCALAR.name, **{c.A_NAME: "lr"}) == 0.25
    assert value(tel, c.STEPS.name) == 4


def test_an_early_step_and_phase_are_kept_under_the_later_settings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A warm-up step with a phase, then configure() with its own providers: one
    session, those settings, the warm-up step among its steps."""
    tel = InMemoryTelemetry()
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        with otel_train.step(samples=3), otel_train.phase("warmup"):
            pass
        early = otel_train.session.current()
        sess = otel_train.configure(console="off", console_every=0, **providers(tel))
        with otel_train.step(samples=5), otel_train.phase("train"):
            pass
        otel_train.shutdown()
    assert sess is early and sess.settings.console_every == 0
    assert _warnings(caplog) == []
    assert value(tel, c.STEPS.name) == 2
    assert value(tel, c.SAMPLES.name) == 8
    phases = {p.attributes[c.A_PHASE] for p in tel.points(c.PHASE_DURATION.name)}
    assert phases == {"warmup", "train"}


def test_a_session_that_began_exporting_restarts_with_the_settings_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Enough bare steps that their exports started at the defaults: a later
    configuration still applies (no error), with one warning saying what happened."""
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for _ in range(40):
            with otel_train.step():
                pass
        early = otel_train.session.current()
        assert early is not None and early.exporting
        tel = InMemoryTelemetry()
        sess = otel_train.configure(console="off", console_every=0, **providers(tel))
        with otel_train.step():
            pass
        otel_train.shutdown()
    assert sess is not early and early.closed and sess.settings.console_every == 0
    (warned,) = _warnings(caplog)
    assert "starts again with them" in warned and "console_every" in warned
    assert value(tel, c.STEPS.name) == 1


def test_a_changed_recording_setting_drops_the_early_records_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tel = InMemoryTelemetry()
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        with otel_train.step():
            pass
        otel_train.configure(console="off", max_pending_steps=64, **providers(tel))
        with otel_train.step():
            pass
        otel_train.shutdown()
    (warned,) = _warnings(caplog)
    assert "is dropped" in warned and "'max_pending_steps'" in warned
    assert value(tel, c.STEPS.name) == 1


def test_a_second_configuration_with_other_settings_is_still_an_error() -> None:
    """The first configuration fixes the settings: record(), configure(), then an
    instrument() with others is an error naming the configure() that started it."""
    otel_train.record(loss=1.0)
    otel_train.configure(console="off", console_every=5)
    model, opt = tiny_model()
    with pytest.raises(otel_train.ConfigError) as err:
        otel_train.instrument(model, optimizer=opt, console_every=0, console="off")
    text = str(err.value)
    assert "setting 'console_every' is 5 there, 0 here" in text
    assert "started by otel_train.configure()" in text
    assert not attached(model)


def test_a_bad_configuration_after_early_calls_fails_and_leaves_no_session() -> None:
    otel_train.record(loss=1.0)
    with pytest.raises(otel_train.ConfigError, match="'console_every'"):
        otel_train.configure(console_every=-1)
    # (Settings are checked before the early session changes: it is still there.)
    assert otel_train.session.current() is not None


def test_built_with_lists_every_setting_the_recording_code_reads() -> None:
    """Settings read by the recording code (but the efficiency tracker's, which a new
    configuration rebuilds, and ``role``, read where it is used) are in BUILT_WITH: a
    recorder kept across a configuration was built with the same values."""
    read: set[str] = set()
    for path in RECORDING.glob("*.py"):
        if path.name != "efficiency.py":
            read |= set(re.findall(r"\bsettings\.([a-z_]+)\b", path.read_text()))
    assert read - {"role"} <= set(BUILT_WITH), read - {"role"} - set(BUILT_WITH)


def test_exports_that_fail_to_start_after_bare_calls_are_logged_never_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The defaults the bare calls started with ask for a port another process holds:
    the start, on the training thread, logs the error and records nothing more; the
    loop goes on, and shutdown() says it was not all exported."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("OTEL_TRAIN_PROMETHEUS", "true")
        monkeypatch.setenv("OTEL_TRAIN_PROMETHEUS_PORT", str(taken.getsockname()[1]))
        with caplog.at_level(logging.WARNING, logger="otel_train"):
            for _ in range(40):
                with otel_train.step(), otel_train.phase("train"):
                    pass
            assert not otel_train.shutdown()
    (failed,) = [r for r in caplog.records if "starting the exports failed" in r.getMessage()]
    assert "'prometheus_port'" in failed.exc_text
