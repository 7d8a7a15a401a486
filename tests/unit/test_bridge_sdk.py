"""The histogram bridge's private SDK names (export/bridge.py, SDK_INTERNALS): checked at
import; an SDK without one of them turns the bridge off with one warning, and recording
goes on (the duration histograms through the metrics API)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from opentelemetry.sdk.metrics.export import MetricReader

from otel_train.export import bridge

JOB = textwrap.dedent("""
    import json, logging, sys
    from opentelemetry.sdk.metrics.export import MetricReader

    del MetricReader._receive_metrics  # an SDK release that moved it (its readers keep theirs)
    logging.basicConfig()
    import torch
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    import otel_train
    from otel_train import contract as c
    from otel_train.testing import InMemoryTelemetry

    tel = InMemoryTelemetry()
    if sys.argv[1] == "application":  # plain SDK providers, the helper's exporter kept
        tel.reader = InMemoryMetricReader()
        tel.meter_provider = MeterProvider(metric_readers=[tel.reader])
    otel_train.configure(console="off", trace_steps="all", tracer_provider=tel.tracer_provider,
                         meter_provider=tel.meter_provider)
    model = torch.nn.Linear(4, 1)
    for _ in range(5):
        with otel_train.step(samples=2), otel_train.phase("forward"):
            model(torch.randn(2, 4)).sum().backward()
    tel.flush(15)
    (steps,) = tel.points(c.STEPS.name)
    (durations,) = tel.points(c.STEP_DURATION.name)
    print(json.dumps({"steps": steps.value, "durations": durations.count,
                      "spans": len([s for s in tel.spans() if s.name == c.STEP_SPAN.name])}))
    otel_train.shutdown()
""")


def test_this_sdk_has_every_internal_the_bridge_uses() -> None:
    assert bridge.missing_sdk_internals() == []
    assert bridge.BRIDGE_WORKS


@pytest.mark.parametrize(
    ("owner", "name"), [(MetricReader, "_receive_metrics"), (MetricReader, "__init__")]
)
def test_a_missing_internal_is_named(
    monkeypatch: pytest.MonkeyPatch, owner: type, name: str
) -> None:
    if name == "__init__":  # a reader that no longer sets its temporality in __init__
        original = MetricReader.__init__

        def init(self: MetricReader, *args: object, **kwargs: object) -> None:
            original(self, *args, **kwargs)
            del self._instrument_class_temporality

        monkeypatch.setattr(MetricReader, "__init__", init)
        assert bridge.missing_sdk_internals() == ["a MetricReader: _instrument_class_temporality"]
    else:
        monkeypatch.delattr(owner, name)
        assert bridge.missing_sdk_internals() == ["MetricReader: _receive_metrics"]


@pytest.mark.parametrize("providers", ["helper", "application"])
def test_without_an_internal_the_bridge_is_off_with_one_warning_and_recording_goes_on(
    providers: str,
) -> None:
    """The helper's providers, or an application's plain SDK ones (which the sidecar's
    relay serves while the bridge works: without it the histograms are recorded here)."""
    done = subprocess.run([sys.executable, "-c", JOB, providers], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "histogram bridge is off" in line]
    assert len(warnings) == 1, done.stderr
    assert "MetricReader: _receive_metrics" in warnings[0]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"steps": 5, "durations": 5, "spans": 5}
