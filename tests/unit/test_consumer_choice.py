"""Where the steps are consumed is chosen once, at the session's start, and said once:
the sidecar by default, a thread of the training process with ``sidecar="off"``; the
choice is the ``otel_train.consumer`` resource attribute of otel-train's own SDK."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import otel_train
from otel_train import contract as c
from otel_train import session


@pytest.mark.parametrize(("sidecar", "where"), [("auto", "sidecar"), ("off", "thread")])
def test_the_consumer_is_chosen_once_and_said(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, sidecar: str, where: str
) -> None:
    caplog.set_level(logging.INFO, logger="otel_train")
    otel_train.configure(prometheus=False, console="off", sidecar=sidecar,
                         run_dir=str(tmp_path), trace_steps="all")  # fmt: skip
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
    (traces,) = tmp_path.glob("*/rank0.traces.jsonl")
    resources = [
        {a["key"]: a["value"].get("stringValue") for a in rs["resource"]["attributes"]}
        for line in traces.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
    ]
    assert resources and all(r.get(c.RESOURCE_CONSUMER.key) == where for r in resources)
