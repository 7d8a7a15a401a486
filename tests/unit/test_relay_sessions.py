"""The same application SDK providers passed to one session after another in one process
(a notebook, a test suite): each session's telemetry reaches them through the sidecar's
relay, and what an earlier session left is not read again."""

from __future__ import annotations

from typing import Any

import pytest
from test_relay import AppProviders

import otel_train
from otel_train import contract as c


def _session(app: AppProviders, steps: int, sidecar: str) -> dict[str, Any]:
    """``steps`` traced steps with ``app``'s providers; what the providers had at the
    flush: the step count, the step durations' count and the step spans."""
    app.spans.clear()
    otel_train.configure(console="off", trace_steps="all", sidecar=sidecar, **app.given())
    session = otel_train.session.current()
    assert session is not None
    for _ in range(steps):
        with otel_train.step(), otel_train.phase("work"):
            pass
    assert otel_train.flush(timeout=15)
    metrics = app.metrics()
    spans = [s for s in app.spans.get_finished_spans() if s.name == c.STEP_SPAN.name]
    seen = {
        "relay": session.feeder is not None and session.feeder.relay is not None,
        "steps": [p.value for p in metrics.get(c.STEPS.name, [])],
        "durations": [p.count for p in metrics.get(c.STEP_DURATION.name, [])],
        "spans": sorted(s.attributes[c.STEP_INDEX.key] for s in spans),
    }
    assert otel_train.shutdown()
    return seen


@pytest.mark.parametrize("sidecar", ["auto", "off"])
def test_a_second_session_on_the_same_providers_reports_its_own_steps(sidecar: str) -> None:
    app = AppProviders()
    first = _session(app, 5, sidecar)
    second = _session(app, 3, sidecar)
    assert first["relay"] == second["relay"] == (sidecar == "auto")
    assert first["steps"] == [5.0] and first["durations"] == [5]
    assert len(first["spans"]) == 5
    # The second session's own figures, not the first one's read again (nor summed).
    assert second["steps"] == [3.0]
    assert len(second["spans"]) == 3
    # The relay's histograms come through the bridge, from the second session's mirror;
    # on a thread they are recorded through the metrics API, whose cumulative stream is
    # the provider's whole life (5 + 3).
    assert second["durations"] == ([3] if sidecar == "auto" else [8])
