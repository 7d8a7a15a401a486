"""The CUDA memory snapshot on a real device: a deliberate OOM under a small allocation
cap is dumped, linked from the failing phase's span and re-raised unchanged; a step
window dumps once; the component works without otel-train."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import otel_train
from otel_train import contract as c
from otel_train.debug.memory_snapshot import MemorySnapshot
from otel_train.testing import InMemoryTelemetry

pytestmark = pytest.mark.gpu

GiB = 1 << 30
PATH_KEY = c.MEMORY_SNAPSHOT_PATH.key


@pytest.fixture
def capped() -> Iterator[torch.device]:
    """CUDA initialised, allocations capped near 1 GiB (restored afterwards)."""
    torch.cuda.init()
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, GiB / total), device)
    yield device
    torch.cuda.set_per_process_memory_fraction(1.0, device)
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.empty_cache()


def too_big(device: torch.device) -> torch.Tensor:
    return torch.empty(4 * GiB, dtype=torch.uint8, device=device)


def snapshot_events(span: Any) -> list[Any]:
    return [e for e in span.events if e.name == c.MEMORY_SNAPSHOT_EVENT]


def load(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        return pickle.load(f)  # type: ignore[no-any-return]


def saw_oom(snapshot: dict[str, Any]) -> bool:
    return any(e.get("action") == "oom" for trace in snapshot["device_traces"] for e in trace)


def test_oom_in_a_phase_is_dumped_linked_and_reraised_unchanged(
    capped: torch.device, tmp_path: Path
) -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(
        tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider,
        console="off", trace_steps="all", memory_snapshot="oom", debug_dir=str(tmp_path),
    )  # fmt: skip
    raised: list[BaseException] = []
    with otel_train.step(), otel_train.phase("warmup"):
        keep = torch.ones(1 << 20, device=capped)
    original: BaseException | None = None
    try:
        with otel_train.step(), otel_train.phase("outer"), otel_train.phase("forward"):
            try:
                too_big(capped)
            except torch.cuda.OutOfMemoryError as err:
                original = err
                raise
    except torch.cuda.OutOfMemoryError as err:
        raised.append(err)
    del keep
    otel_train.shutdown()

    assert raised and raised[0] is original  # the user's error, not a copy or a wrapper
    assert "out of memory" in str(raised[0]).lower()
    spans = {s.name: s for s in tel.spans()}
    (event,) = snapshot_events(spans["forward"])  # the failing (innermost) phase only
    assert not snapshot_events(spans["outer"])
    assert event.attributes[c.MEMORY_SNAPSHOT_REASON.key] == "oom"
    path = event.attributes[PATH_KEY]
    assert Path(path).parent == tmp_path.resolve()
    assert saw_oom(load(path))


def test_oom_in_an_instrumented_forward_is_linked(capped: torch.device, tmp_path: Path) -> None:
    tel = InMemoryTelemetry()

    class Greedy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            too_big(x.device)
            return self.lin(x)

    model = Greedy().to(capped)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    otel_train.instrument(
        model, optimizer=opt, tracer_provider=tel.tracer_provider,
        meter_provider=tel.meter_provider, console="off", trace_steps="all",
        memory_snapshot="oom", debug_dir=str(tmp_path),
    )  # fmt: skip
    with pytest.raises(torch.cuda.OutOfMemoryError):
        model(torch.randn(2, 4, device=capped)).sum().backward()
    otel_train.shutdown()
    (forward,) = [s for s in tel.spans() if s.name == "forward"]
    (event,) = snapshot_events(forward)
    assert saw_oom(load(event.attributes[PATH_KEY]))


def test_window_dumps_once_at_its_last_step(capped: torch.device, tmp_path: Path) -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(
        tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider,
        console="off", memory_snapshot="1-2", debug_dir=str(tmp_path),
    )  # fmt: skip
    held = []
    for _ in range(5):
        with otel_train.step(), otel_train.phase("alloc"):
            held.append(torch.ones(1 << 18, device=capped))
    otel_train.shutdown()
    (path,) = tmp_path.iterdir()
    snapshot = load(str(path))
    allocs = [e for trace in snapshot["device_traces"] for e in trace if e["action"] == "alloc"]
    assert allocs  # the window's allocations are in the history
    steps = {s.attributes[c.STEP_INDEX.key]: s for s in tel.spans() if s.name == "otel_train.step"}
    (event,) = snapshot_events(steps[2])
    assert event.attributes[PATH_KEY] == str(path)
    assert event.attributes[c.MEMORY_SNAPSHOT_REASON.key] == "window"
    assert not any(snapshot_events(s) for i, s in steps.items() if i != 2)


def test_guard_without_otel_train(capped: torch.device, tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("user")
    snap = MemorySnapshot(tmp_path)
    assert snap.start()
    with (
        pytest.raises(torch.cuda.OutOfMemoryError),
        tracer.start_as_current_span("forward"),
        snap.guard(),
    ):
        too_big(capped)
    snap.close()
    (span,) = exporter.get_finished_spans()
    (event,) = snapshot_events(span)
    assert event.attributes[PATH_KEY] == snap.paths[0]
    assert saw_oom(load(snap.paths[0]))


def test_oom_outside_any_phase_is_dumped_by_the_observer(
    capped: torch.device, tmp_path: Path
) -> None:
    """An OOM inside optimizer.step() (no phase exit runs) still leaves a snapshot."""
    snap = MemorySnapshot(tmp_path)
    assert snap.start()
    with pytest.raises(torch.cuda.OutOfMemoryError):
        too_big(capped)
    snap.close()
    (path,) = snap.paths
    assert saw_oom(load(path))


def test_oom_dumps_are_bounded_per_process(capped: torch.device, tmp_path: Path) -> None:
    """A loop that catches OOMs and retries writes at most max_dumps snapshots."""
    snap = MemorySnapshot(tmp_path, max_dumps=2)
    assert snap.start()
    linked = []
    for _ in range(4):
        try:
            too_big(capped)
        except torch.cuda.OutOfMemoryError as err:
            linked.append(snap.handle_error(err))
    snap.close()
    assert len(list(tmp_path.iterdir())) == 2
    assert linked[:2] == snap.paths and linked[2:] == [None, None]
