"""The defaults and the CUDA paths the GPU review found broken, on a real device.

Issue 22: the default path (the helper process) on a GPU, CUDA-graph captures while steps
are pending (``make_graphed_callables`` and ``torch.cuda.graph``), ``torch.compile``, a
first step past the clock's re-anchor interval, the GPU lagging past
``max_pending_steps``, ``device_timing="off"`` with CUDA scalars, PyTorch's new precision
API, the Hugging Face adapter, and no CUDA context on another device. Each test checks
that telemetry stayed on and that the figures are there; the CPU twins of most of them
(tests/unit/test_cuda_paths.py) check the mechanisms against a stand-in runtime.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any

import pytest
import torch
from gpu_helpers import mlp

import otel_train
from otel_train import contract as c
from otel_train.recording.device import DeviceClock
from otel_train.testing import InMemoryTelemetry

pytestmark = pytest.mark.gpu


def _providers(tel: InMemoryTelemetry) -> dict[str, Any]:
    return {"tracer_provider": tel.tracer_provider, "meter_provider": tel.meter_provider}


def _healthy() -> Any:
    session = otel_train.session.current()
    assert session is not None
    assert session.recorder.enabled, "recording switched itself off"
    assert session.worker is None or not session.worker.failed, "the worker switched off"
    return session


def _steps(model: torch.nn.Module, opt: Any, x: torch.Tensor, n: int) -> torch.Tensor:
    loss = torch.zeros((), device=x.device)
    for _ in range(n):
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss


def _scrape(address: tuple[str, int]) -> str:
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=5) as r:
        return str(r.read().decode())


def test_the_default_path_with_the_helper_process(
    cuda: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No providers passed: the sidecar does the work; device times reach its /metrics."""
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    model, opt = mlp(cuda)
    x = torch.randn(64, 1024, device=cuda)
    otel_train.instrument(model, optimizer=opt, prometheus_port=0, console="off")
    session = otel_train.session.current()
    assert session is not None and session.feeder is not None, "the helper did not start"
    torch.cuda.set_sync_debug_mode("error")
    try:
        _steps(model, opt, x, 40)
        otel_train.record(loss=model(x).mean())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert otel_train.flush(timeout=30)
    _healthy()
    text = _scrape(session.prometheus_address)
    assert 'clock="device"' in text and 'phase="forward"' in text
    assert otel_train.shutdown(timeout=30)


def test_make_graphed_callables_while_steps_are_pending(cuda: torch.device) -> None:
    """Its warm-up and capture run the instrumented forward and backward; the worker
    polls meanwhile. Nothing breaks the capture, nothing is recorded into it, and the
    graphed steps are recorded (the CPU twin: tests/unit/test_compile.py)."""
    tel = InMemoryTelemetry()
    model, opt = mlp(cuda)
    x = torch.randn(64, 1024, device=cuda)
    otel_train.instrument(model, optimizer=opt, console="off", trace_steps="all",
                          **_providers(tel))  # fmt: skip
    _steps(model, opt, x, 5)  # pending: not synchronised
    graphed = torch.cuda.make_graphed_callables(model, (x.detach().requires_grad_(),))
    for _ in range(10):
        loss = graphed(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    _healthy()
    assert otel_train.shutdown(timeout=30)
    steps = sorted(s.attributes[c.STEP_INDEX.key] for s in tel.spans()
                   if s.name == c.STEP_SPAN.name)  # fmt: skip
    # 15 optimizer steps: the 5 before; the step holding the warm-up, the capture and the
    # first graphed iteration (a forward of ours ran in it); the second graphed iteration
    # is the one whose end shows the forward replaced, and is lost, as in the CPU twin;
    # each of the last 8 opens where the previous one ended. (Before the fix: 6 of 15.)
    assert steps == list(range(5 + 1 + 8)), steps


def test_a_cuda_graph_capture_while_steps_are_pending(cuda: torch.device) -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", **_providers(tel))
    a = torch.randn(2048, 2048, device=cuda)
    for _ in range(5):
        with otel_train.step(), otel_train.phase("matmul"):
            b = a @ a
    static_in = torch.randn(2048, 2048, device=cuda)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        static_out = static_in @ static_in  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with otel_train.step(), otel_train.phase("captured"):
            static_out = static_in @ static_in
        time.sleep(0.6)  # the worker wakes (every 0.05 s) and would query now
    for _ in range(5):
        with otel_train.step(), otel_train.phase("replay"):
            graph.replay()
    torch.cuda.synchronize()
    _healthy()
    assert otel_train.shutdown(timeout=30)
    spans = tel.spans()
    replays = [s for s in spans if s.name == "replay"]
    assert len(replays) == 5
    assert all(s.attributes[c.PHASE_CLOCK.key] == "device" for s in replays)
    (captured,) = [s for s in spans if s.name == "captured"]
    assert captured.attributes[c.PHASE_CLOCK.key] == "host"
    del b, static_out


def test_torch_compile_on_the_gpu(cuda: torch.device) -> None:
    tel = InMemoryTelemetry()
    model, opt = mlp(cuda)
    loader = torch.utils.data.DataLoader(torch.randn(32 * 8, 1024), batch_size=32)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          trace_steps="all", **_providers(tel))  # fmt: skip
    compiled = torch.compile(model)
    for x in loader:
        loss = compiled(x.to(cuda, non_blocking=True)).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    _healthy()
    assert otel_train.shutdown(timeout=60)
    steps = [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
    assert len(steps) == 8
    assert all(s.attributes[c.STEP_DEVICE_DURATION.key] > 0 for s in steps)


def test_a_first_step_past_the_reanchor_interval(cuda: torch.device) -> None:
    """The clock re-anchors inside the call that took its first anchor (at 30 s by
    default; 50 ms here)."""
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", sidecar="off", **_providers(tel))
    session = _healthy()
    assert session.worker is not None
    session.worker.source.clock = DeviceClock(session.recorder.events, reanchor_ns=50_000_000)
    a = torch.randn(2048, 2048, device=cuda)
    with otel_train.step(), otel_train.phase("first"):
        a @ a
        time.sleep(0.1)  # a long first step (compilation, autotuning)
    for _ in range(50):
        with otel_train.step(), otel_train.phase("matmul"):
            a @ a
    torch.cuda.synchronize()
    assert otel_train.flush(timeout=30)
    free = list(session.recorder.events.free)
    assert len({id(e) for e in free}) == len(free), "an event is in the pool twice"
    _healthy()
    assert otel_train.shutdown(timeout=30)
    matmuls = [s for s in tel.spans() if s.name == "matmul"]
    assert len(matmuls) == 50
    assert all(s.attributes[c.PHASE_DEVICE_DURATION.key] > 0 for s in matmuls)


def test_the_gpu_lagging_past_max_pending_steps(cuda: torch.device) -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", max_pending_steps=4,
                         **_providers(tel))  # fmt: skip
    a = torch.randn(8192, 8192, device=cuda)
    for _ in range(40):  # the host runs far ahead of the device
        with otel_train.step(), otel_train.phase("matmul"):
            a @ a
    session = _healthy()
    torch.cuda.synchronize()
    assert otel_train.flush(timeout=30)
    dropped = session.recorder.dropped_steps
    _healthy()
    assert otel_train.shutdown(timeout=30)
    steps = [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
    assert dropped > 0 and len(steps) + dropped == 40


def test_device_timing_off_with_cuda_scalars(cuda: torch.device) -> None:
    tel = InMemoryTelemetry()
    model, opt = mlp(cuda)
    x = torch.randn(64, 1024, device=cuda)
    otel_train.instrument(model, optimizer=opt, console="off", device_timing="off",
                          **_providers(tel))  # fmt: skip
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            loss = _steps(model, opt, x, 1)
            otel_train.record(loss=loss)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    _healthy()
    assert otel_train.shutdown(timeout=30)
    (point,) = tel.points(c.SCALAR.name)
    assert point.value == pytest.approx(float(loss.detach().cpu()))


def test_the_new_precision_api(cuda: torch.device) -> None:
    before = torch.backends.fp32_precision
    torch.backends.fp32_precision = "tf32"
    try:
        tel = InMemoryTelemetry()
        model, opt = mlp(cuda)
        x = torch.randn(64, 1024, device=cuda)
        # (a peak given: MFU is sent on any device, the table's or not, with its dtype)
        otel_train.instrument(model, optimizer=opt, console="off", peak_tflops=100.0,
                              **_providers(tel))  # fmt: skip
        _steps(model, opt, x, 10)
        torch.cuda.synchronize()
        _healthy()
        assert otel_train.shutdown(timeout=30)
    finally:
        torch.backends.fp32_precision = before
    (point,) = tel.points(c.MFU.name)
    assert point.attributes[c.A_DTYPE] == "tf32"


def test_the_hugging_face_adapter_on_the_gpu(cuda: torch.device, tmp_path: Any) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128,
                                     n_positions=64)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 128, (64, 32))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8,
                                          max_steps=8, bf16=True, report_to=[], logging_steps=4,
                                          save_strategy="no")  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    tel = InMemoryTelemetry()
    otel_train.instrument(trainer, console="off", trace_steps="all", **_providers(tel))
    trainer.train()
    torch.cuda.synchronize()
    _healthy()
    assert otel_train.shutdown(timeout=30)
    steps = [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
    assert len(steps) == 8
    assert all(s.attributes[c.STEP_DEVICE_DURATION.key] > 0 for s in steps)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
def test_no_context_on_a_device_other_than_the_recorders() -> None:
    """A model on cuda:1, no set_device: the worker's queries must not open device 0."""
    device = torch.device("cuda", 1)
    tel = InMemoryTelemetry()
    model, opt = mlp(device)
    x = torch.randn(64, 1024, device=device)
    otel_train.instrument(model, optimizer=opt, console="off", **_providers(tel))
    _steps(model, opt, x, 20)
    torch.cuda.synchronize(device)
    time.sleep(1.0)  # the worker has polled
    _healthy()
    assert otel_train.shutdown(timeout=30)
    listing = torch.cuda.list_gpu_processes(0)
    assert str(os.getpid()) not in listing, listing


def test_a_gpu_jobs_boundaries_go_through_the_ring_to_the_sidecar(
    cuda: torch.device, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Issue 37: with the sidecar, a GPU job's hooks write slots and stamps into the ring
    (no step opens in the training process), the feeder's thread resolves the events,
    and the sidecar's phases are device-timed: a forward that waits on the device for a
    known time (``torch.cuda._sleep``) is at least that long there, whatever its host time.
    The CPU twin: tests/unit/test_gpu_ring.py."""
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    model, opt = mlp(cuda)
    x = torch.randn(64, 1024, device=cuda)
    spin = 20_000_000  # GPU cycles: ~10 ms on a 2 GHz clock

    def slower(module: Any, args: Any) -> None:
        torch.cuda._sleep(spin)  # (the device busy inside the timed forward)

    otel_train.instrument(model, optimizer=opt, prometheus=False, console="off",
                          run_dir=str(tmp_path), trace_steps="all")  # fmt: skip
    session = _healthy()
    handover = session.feeder.handover
    for _ in range(200):
        _steps(model, opt, x, 4)
        if handover.raw:
            break
    assert handover.raw and handover.stamped, "no stamped raw session began"
    hook = model[0].register_forward_pre_hook(slower)
    torch.cuda.set_sync_debug_mode("error")
    try:
        _steps(model, opt, x, 20)
    finally:
        torch.cuda.set_sync_debug_mode(0)
        hook.remove()
    assert handover.raw and handover.left == 0
    assert otel_train.flush(timeout=30)
    assert otel_train.shutdown(timeout=30)
    spans = [
        s
        for f in tmp_path.glob("*/rank0.traces.jsonl")
        for line in f.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
        if s["name"] == "forward"
    ]
    lengths = sorted(int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) for s in spans)
    clocks = {a["value"]["stringValue"] for s in spans for a in s["attributes"]
              if a["key"] == c.PHASE_CLOCK.key}  # fmt: skip
    assert clocks == {"device"}
    print(
        f"forward spans: {len(spans)}, the 20 slowed ones' device ms from {lengths[-20] / 1e6:.3f}"
    )  # (the spin's length depends on the clock)
    assert lengths[-20] >= 3_000_000  # (~10 ms of spin at any clock under ~6.7 GHz)
