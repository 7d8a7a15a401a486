"""Where the steps are consumed is chosen once, at the session's start, and said once:
the sidecar by default, a thread of the training process with ``sidecar="off"``."""

from __future__ import annotations

import logging

import pytest

import otel_train
from otel_train import session


@pytest.mark.parametrize(("sidecar", "where"), [("auto", "sidecar"), ("off", "thread")])
def test_the_consumer_is_chosen_once_and_said(
    caplog: pytest.LogCaptureFixture, sidecar: str, where: str
) -> None:
    caplog.set_level(logging.INFO, logger="otel_train")
    otel_train.configure(prometheus=False, console="off", sidecar=sidecar)
    try:
        current = session.current()
        assert current is not None
        assert current.consumer == where
        with otel_train.step(samples=1), otel_train.phase("forward"):
            pass
    finally:
        otel_train.shutdown()
    said = [r.getMessage() for r in caplog.records if "steps are consumed" in r.getMessage()]
    assert said == [f"otel-train: steps are consumed on {where}, exported by otel-train's SDK"]
