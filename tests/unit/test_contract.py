"""The telemetry contract: docs/telemetry.md is generated from it, and every metric it
declares is emitted (CUDA-only ones excepted on machines without CUDA)."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from opentelemetry.sdk.metrics.export import Gauge, Histogram, Sum
from otel_helpers import providers, single_rank_group, tiny_loader, tiny_model, train_epoch, value

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

REPO = Path(__file__).resolve().parents[2]
CUDA_ONLY = {c.PHASE_MEMORY_PEAK, c.DEVICE_MEMORY_LIMIT}


def test_docs_telemetry_md_is_the_generated_reference() -> None:
    generated = subprocess.run(
        [sys.executable, "-m", "otel_train.contract"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert generated == c.render_markdown()
    assert (REPO / "docs" / "telemetry.md").read_text() == generated, (
        "docs/telemetry.md is stale: run `python -m otel_train.contract > docs/telemetry.md`"
    )


def test_the_package_re_exports_every_public_name_of_its_parts() -> None:
    """otel_train/contract/ is one contract: what any of its modules defines is a name of
    ``otel_train.contract`` (listed in its ``__all__``), the same object."""
    for path in sorted((REPO / "otel_train" / "contract").glob("*.py")):
        if path.name.startswith("__"):
            continue
        module = __import__(f"otel_train.contract.{path.stem}", fromlist=["_"])
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            else:
                continue
            for name in names:
                if not name.startswith("_"):
                    assert name in c.__all__, f"{path.name}: {name} is not re-exported"
                    assert getattr(c, name) is getattr(module, name), name


def test_reference_lists_every_span_attribute_and_metric() -> None:
    text = c.render_markdown()
    for spec in c.METRICS:
        assert f"`{spec.name}`" in text and f"`{c.prometheus_base_name(spec)}`" in text
    for span in c.SPANS:
        for a in span.attributes:
            assert f"`{a.key}`" in text


def test_contract_names_are_unique_and_units_are_ucum() -> None:
    names = [m.name for m in c.METRICS]
    assert len(names) == len(set(names))
    allowed = {
        "s",
        "By",
        "1",
        "{sample}/s",
        "{token}/s",
        "{step}",
        "{sample}",
        "{token}",
        "{value}",
        "{item}",
        "{span}",
        "{flop}",
        "{flop}/s",
        "{version}",
    }
    assert {m.unit for m in c.METRICS} <= allowed
    kinds = ("histogram", "counter", "gauge", "updowncounter")
    assert all(m.instrument in kinds for m in c.METRICS)
    assert list(c.DURATION_BUCKETS) == sorted(set(c.DURATION_BUCKETS))
    assert list(c.STALENESS_BUCKETS) == sorted(set(c.STALENESS_BUCKETS))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (c.PHASE_DURATION, ("otel_train_phase_duration_seconds",)),  # a native histogram
        (c.STEPS, ("otel_train_steps_total",)),
        (c.PROCESS_MEMORY_RSS, ("process_memory_usage_bytes",)),
        (c.MFU, ("otel_train_mfu_ratio",)),
        (c.THROUGHPUT_FLOPS, ("otel_train_throughput_flops_per_second",)),
        (c.OVERHEAD, ("otel_train_overhead_seconds",)),
        (c.SCALAR, ("otel_train_scalar",)),
    ],
)
def test_prometheus_names(spec: c.MetricSpec, expected: tuple[str, ...]) -> None:
    assert c.prometheus_names(spec) == expected


def test_scrape_names_drop_the_ratio_suffix_of_unit_one_gauges() -> None:
    assert c.prometheus_names(c.MFU, source="scrape") == ("otel_train_mfu",)
    assert c.prometheus_names(c.STEPS, source="scrape") == c.prometheus_names(c.STEPS)
    # /metrics writes classic histograms: the text format has no native ones
    assert c.prometheus_names(c.PHASE_DURATION, source="scrape") == (
        "otel_train_phase_duration_seconds_bucket",
        "otel_train_phase_duration_seconds_sum",
        "otel_train_phase_duration_seconds_count",
    )


@pytest.mark.parametrize("spec", c.METRICS, ids=lambda m: m.name)
def test_scrape_names_are_what_the_prometheus_exporter_serves(spec: c.MetricSpec) -> None:
    """Each contract metric, recreated with its kind and unit behind the OTel Prometheus
    reader, is served under exactly the names the contract predicts (CUDA-only ones too)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.metrics import Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=True)
    provider = MeterProvider(
        metric_readers=[PrometheusMetricReader(registry=registry)], shutdown_on_exit=False
    )
    meter = provider.get_meter(c.SCOPE_NAME)
    kw = {"unit": spec.unit, "description": spec.description}
    if spec.instrument == "histogram":
        meter.create_histogram(spec.name, **kw).record(0.5)
    elif spec.instrument == "counter":
        meter.create_observable_counter(spec.name, [lambda o: [Observation(1.0)]], **kw)
    else:
        meter.create_observable_gauge(spec.name, [lambda o: [Observation(1.0)]], **kw)
    try:
        text = generate_latest(registry).decode()
    finally:
        provider.shutdown()
    served = {
        ln.split("{", 1)[0].split(" ", 1)[0]
        for ln in text.splitlines()
        if ln and not ln.startswith("#")
    } - {"target_info"}
    assert served == set(c.prometheus_names(spec, source="scrape"))


def test_cuda_only_metrics_say_so() -> None:
    for spec in CUDA_ONLY:
        assert "CUDA" in spec.description


def test_every_metric_in_the_contract_is_emitted() -> None:
    """One CPU run exercising everything; the CUDA-only metrics appear only with CUDA."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=16, batch_size=8)
    otel_train.instrument(
        model,
        optimizer=opt,
        dataloader=loader,
        trace_steps="all",
        console="off",
        max_pending_steps=2,
        peak_tflops=1.0,  # MFU and the peak gauge need a peak; a CPU has none in the table
        sidecar="off",  # (its worker in this process, read and held below)
        **providers(tel),
    )
    session = otel_train.session.current()

    def wait_processed(n: int) -> None:  # bounded: the worker polls every 50 ms
        deadline = time.monotonic() + 10
        while session.worker.steps_processed < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert session.worker.steps_processed == n

    train_epoch(model, opt, loader)
    wait_processed(2)
    with otel_train.step(samples=4, tokens=40), otel_train.phase("rollout"):
        otel_train.record(reward=1.5)
        carrier = otel_train.carrier(policy_version=1)
    wait_processed(3)
    with otel_train.phase("generate", parent=carrier) as generate:  # (RL: staleness)
        pass
    with otel_train.step(samples=4), single_rank_group() as dist:
        otel_train.consumed(generate.produced(), policy_version=3)
        dist.barrier()  # a blocking collective (a group of one: it returns at once)
    wait_processed(4)
    # Hold the worker off while 5 more steps finish: with room for 2 pending steps the
    # oldest 3 are dropped (and counted), never waited for.
    with session.worker._lock:
        for _ in range(5):
            with otel_train.step(samples=1):
                pass
    otel_train.shutdown()

    collected = tel.metrics()
    expected = {m.name for m in c.METRICS} - (
        set() if torch.cuda.is_available() else {m.name for m in CUDA_ONLY}
    )
    missing = expected - set(collected)
    assert not missing
    # The deprecated aliases (one release) beside their replacements, with their values.
    for old, new in c.DEPRECATED_METRICS:
        if new.name in collected:
            assert collected[old.name].description == old.description
            olds = [p.value for p in collected[old.name].data.data_points]
            news = [p.value for p in collected[new.name].data.data_points]
            assert olds and len(olds) == len(news)
            if new is not c.PROCESS_MEMORY_RSS:  # (the RSS moves between two collections)
                assert sorted(olds) == sorted(news)
        else:
            assert old.name not in collected
    assert value(tel, c.DROPPED.name, reason="queue_full") == 3
    assert value(tel, c.STEPS.name) == 2 + 2 + 2
    for spec in c.METRICS:
        metric = collected.get(spec.name)
        if metric is None:
            continue
        assert metric.unit == spec.unit
        assert metric.description == spec.description
        kinds = {"histogram": Histogram, "counter": Sum, "updowncounter": Sum, "gauge": Gauge}
        assert isinstance(metric.data, kinds[spec.instrument]), spec.name
        if spec.instrument in ("counter", "updowncounter"):
            assert metric.data.is_monotonic == (spec.instrument == "counter"), spec.name
        for point in metric.data.data_points:
            assert set(point.attributes) <= set(spec.attributes), spec.name
