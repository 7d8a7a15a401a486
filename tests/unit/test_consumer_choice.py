"""Where the steps are consumed is chosen once, at the session's start, and said once:
the sidecar by default, a thread of the training process with ``sidecar="off"`` or when
the sidecar cannot start; the choice is the ``otel_train.consumer`` resource attribute
of otel-train's own SDK. The session drives either through one interface
(wiring.Consumer): both pass the same flush and end checks."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider
from otel_helpers import providers

import otel_train
from otel_train import contract as c
from otel_train import session
from otel_train.runs.record_data import load_run
from otel_train.testing import InMemoryTelemetry

SAID = "steps are consumed"


def _run(tmp_path: Path, steps: int, **settings: object) -> session.Session:
    """A session at ``settings`` with its run record in ``tmp_path``, ``steps`` run."""
    otel_train.configure(prometheus=False, console="off", run_dir=str(tmp_path),
                         trace_steps="all", **settings)  # fmt: skip
    current = session.current()
    assert current is not None
    for _ in range(steps):
        with otel_train.step(samples=1), otel_train.phase("forward"):
            pass
    return current


def _resources(tmp_path: Path) -> list[dict[str, str]]:
    (traces,) = tmp_path.glob("*/rank0.traces.jsonl")
    return [
        {a["key"]: a["value"].get("stringValue") for a in rs["resource"]["attributes"]}
        for line in traces.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
    ]


def _said(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if SAID in r.getMessage()]


@pytest.mark.parametrize(
    ("sidecar", "where", "why"),
    [("auto", "sidecar", "the default"), ("off", "thread", "sidecar='off'")],
)
def test_the_consumer_is_chosen_once_and_said(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, sidecar: str, where: str, why: str
) -> None:
    caplog.set_level(logging.INFO, logger="otel_train")
    try:
        current = _run(tmp_path, 1, sidecar=sidecar)
        assert current.consumer is not None and current.consumer.where == where
    finally:
        otel_train.shutdown()
    message = f"otel-train: {SAID} on {where} ({why}), exported by otel-train's SDK"
    assert _said(caplog) == [(logging.INFO, message)]
    resources = _resources(tmp_path)
    assert resources and all(r.get(c.RESOURCE_CONSUMER.key) == where for r in resources)


def test_a_sidecar_that_cannot_start_leaves_the_work_on_a_thread_with_one_warning(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken install as the sidecar's interpreter sees it: an otel_train package first
    on its path that exits at import (the training process has its own imported)."""
    shadow = tmp_path / "shadow" / "otel_train"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise SystemExit(7)\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow.parent))
    caplog.set_level(logging.INFO, logger="otel_train")
    runs = tmp_path / "runs"
    try:
        current = _run(runs, 3)
        assert current.consumer is not None and current.consumer.where == "thread"
        assert otel_train.flush(timeout=10)
    finally:
        assert otel_train.shutdown()
    ((level, message),) = _said(caplog)
    assert level == logging.WARNING
    assert message.startswith(f"otel-train: {SAID} on thread (the sidecar process could not start")
    assert "exit code 7" in message
    resources = _resources(runs)
    assert resources and all(r.get(c.RESOURCE_CONSUMER.key) == "thread" for r in resources)


def _app_providers() -> dict[str, Any]:
    """What an application builds: plain SDK providers with in-memory exporters."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return {"tracer_provider": tracer_provider, "meter_provider": meter_provider}


@pytest.mark.parametrize(
    ("given", "where", "why"),
    [
        ("application", "sidecar", "the default"),
        ("testing", "sidecar", "the default"),
        ("no-op tracer", "thread", "providers the sidecar's relay does not serve"),
    ],
)
def test_passed_providers_are_chosen_for_once_and_said(
    caplog: pytest.LogCaptureFixture, given: str, where: str, why: str
) -> None:
    """An application's SDK providers are served from the sidecar (the relay), as
    otel_train.testing's are; a tracer provider that is not the SDK's keeps the consumer
    on a thread (docs/rationale.md, "Where the work runs")."""
    caplog.set_level(logging.INFO, logger="otel_train")
    passed = _app_providers() if given != "testing" else providers(InMemoryTelemetry())
    if given == "no-op tracer":
        passed["tracer_provider"] = NoOpTracerProvider()
    try:
        otel_train.configure(console="off", **passed)
        current = session.current()
        assert current is not None and current.consumer is not None
        assert current.consumer.where == where
    finally:
        otel_train.shutdown()
    message = f"otel-train: {SAID} on {where} ({why}), exported by the application's providers"
    assert _said(caplog) == [(logging.INFO, message)]


@pytest.mark.parametrize("sidecar", ["auto", "off"])
def test_either_consumer_flushes_and_ends_with_every_step_accounted(
    tmp_path: Path, sidecar: str
) -> None:
    """The same checks through the interface, whichever runs: a flush and an end in
    time, every step in the record, nothing dropped."""
    steps = 12
    try:
        current = _run(tmp_path, steps, sidecar=sidecar)
        consumer = current.consumer
        assert consumer is not None and consumer.exports_traces and consumer.takes_carriers
        assert otel_train.flush(timeout=10)
        assert sum(consumer.export_drops().values()) == 0
    finally:
        assert otel_train.shutdown()
    assert current.recorder.enabled is False  # (the end turned recording off)
    (rank,) = load_run(next(tmp_path.iterdir())).ranks
    last = rank.snapshots[-1].values
    assert last[(c.STEPS.name, ())] == steps
    assert not [k for k in last if k[0] == c.DROPPED.name]
    spans = [
        s["name"]
        for line in next(tmp_path.glob("*/rank0.traces.jsonl")).read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]
    assert spans.count(c.STEP_SPAN.name) == steps
