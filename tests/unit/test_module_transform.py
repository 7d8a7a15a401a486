"""An mnist-shaped loop (mnist_loop.py) under the zero-code hooks, its dataset's transform
an ``nn.Module`` as torchvision's ``Normalize`` is (issue 38 item 10): the transform runs
inside the DataLoader's fetch, in this process or in a worker, and is data there, not
the start of the forward phase. Each step keeps its ``data`` phase, its batch's samples
(the first batch's too) and a data stall above 0. (tests/e2e/test_zero_code.py runs it
under the real ``opentelemetry-instrument`` with spawned workers.)"""

from __future__ import annotations

from collections import Counter

import pytest
from mnist_loop import BATCH, EPOCHS, ITERATIONS, SAMPLES, train
from otel_helpers import children_of, providers, step_spans

import otel_train
from otel_train import contract as c
from otel_train.instrumentor import OtelTrainInstrumentor
from otel_train.testing import InMemoryTelemetry

PHASES = ["data", "forward", "backward", "optimizer"]


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_a_module_transform_in_the_dataset_is_data(workers: int) -> None:
    tel = InMemoryTelemetry()
    inst = OtelTrainInstrumentor()
    inst.instrument(tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider)
    try:
        otel_train.configure(console="off", trace_steps="all", **providers(tel))
        iterations, samples = train(workers)
        otel_train.shutdown()
    finally:
        inst.uninstrument()
    assert (iterations, samples) == (ITERATIONS, EPOCHS * SAMPLES)
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == ITERATIONS
    for step in steps:
        assert [p.name for p in children_of(spans, step)] == PHASES
        assert step.attributes[c.STEP_SAMPLES.key] == BATCH
        assert step.attributes[c.STEP_DATA_STALL.key] > 0
    phases = Counter(s.name for s in spans if s.name != c.STEP_SPAN.name)
    assert phases == dict.fromkeys(PHASES, ITERATIONS)
    (counted,) = tel.points(c.SAMPLES.name)
    assert counted.value == samples
