"""The console reaches the stream object the training process has, not only its
descriptor (issue 25 item 1): with the sidecar printing the tables and the run summary,
a ``sys.stderr`` (or ``sys.stdout``) replaced by ``contextlib.redirect_stderr``, pytest's
capture or an IDE's console gets the text, once, and the descriptor does not.

A real Jupyter kernel is tested in tests/e2e/test_jupyter_kernel.py.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
from otel_helpers import tiny_loader, tiny_model, train_epoch

import otel_train

STEPS = 4  # tiny_loader(): 32 rows, batches of 8


def _train_with_the_sidecar(tmp_path: Path, **settings: Any) -> None:
    model, opt = tiny_model()
    loader = tiny_loader()
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console_every=2,
                          prometheus=False, run_dir=str(tmp_path), **settings)  # fmt: skip
    assert otel_train.session.current().feeder is not None  # (the sidecar prints)
    train_epoch(model, opt, loader)


def _check_console(text: str) -> None:
    """The tables and the summary: phase names, shares of the wall clock, the wall."""
    assert text.count("otel-train  steps 0-1") == 1 and "otel-train  steps 2-3" in text
    assert text.count(f"otel-train run summary: {STEPS} steps, wall clock ") == 1
    summary = text[text.index("run summary") :]
    for phase in ("data", "forward", "backward", "optimizer"):
        assert f"\n{phase} " in summary, phase
    assert "% wall" in summary and "%" in summary.split("\nforward", 1)[1].split("\n")[0]
    assert "otel-train: run record in " in summary


def test_redirect_stderr_gets_the_tables_and_the_summary(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        _train_with_the_sidecar(tmp_path)
        assert otel_train.shutdown()
    _check_console(buf.getvalue())
    assert "run summary" not in capfd.readouterr().err  # not also on the descriptor


def test_redirect_stdout_gets_them_with_console_stdout(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _train_with_the_sidecar(tmp_path, console="stdout")
        assert otel_train.shutdown()
    _check_console(buf.getvalue())
    assert "run summary" not in capfd.readouterr().out


def test_a_stream_replaced_after_instrument_gets_what_is_printed_from_then_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Instrumented with the process's own stderr, then training and shutdown under
    ``redirect_stderr``: the summary goes to the replacement (checked at the end)."""
    model, opt = tiny_model()
    loader = tiny_loader()
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console_every=0,
                          prometheus=False, run_dir=str(tmp_path))  # fmt: skip
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        train_epoch(model, opt, loader)
        assert otel_train.shutdown()
    assert buf.getvalue().count(f"otel-train run summary: {STEPS} steps") == 1
    assert "run summary" not in capfd.readouterr().err


def test_the_processs_own_stderr_still_gets_them_from_the_sidecar(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing replaced (the terminal case): the sidecar prints to the descriptor."""
    import sys

    monkeypatch.setattr(sys, "stderr", sys.__stderr__)
    _train_with_the_sidecar(tmp_path)
    assert otel_train.shutdown()
    _check_console(capfd.readouterr().err)
