"""Counting right on a real GPU: what the CUDA stand-in (tests/unit/cuda_standin.py) can
only imitate.

Issue 38 item 14: DDP's ``ddp_all_reduce`` on NCCL is the device's wait, not ~0. Item 5:
a DTensor loss on CUDA is recorded, and recording stays on. Item 7: reentrant activation
checkpointing gives one backward row a step, none from the autograd device thread.
Issue 37: a plain loop's boundaries are stamped, one CUDA event each. The CPU twins:
tests/unit/test_cuda_paths.py, test_values.py, test_backward.py and test_stamps.py.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from gpu_helpers import mlp
from torch.utils.checkpoint import checkpoint

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

pytestmark = pytest.mark.gpu


@pytest.fixture
def nccl(cuda: torch.device) -> Iterator[Any]:
    """torch.distributed with an NCCL group of one rank (this GPU) on loopback."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, device_id=cuda)  # fmt: skip
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def _start(tel: InMemoryTelemetry, model: Any, opt: Any, **settings: Any) -> Any:
    otel_train.instrument(model, optimizer=opt, console="off", trace_steps="all",
                          tracer_provider=tel.tracer_provider,
                          meter_provider=tel.meter_provider, **settings)  # fmt: skip
    session = otel_train.session.current()
    assert session is not None
    return session


def _end(session: Any) -> None:
    """Flush, check that nothing inside telemetry switched itself off, shut down."""
    torch.cuda.synchronize()
    assert otel_train.flush(timeout=30)
    assert session.recorder.enabled, "recording switched itself off"
    assert session.worker is None or not session.worker.failed, "the worker switched off"
    assert otel_train.shutdown(timeout=30)


def _steps(spans: list[Any]) -> list[Any]:
    return sorted((s for s in spans if s.name == c.STEP_SPAN.name),
                  key=lambda s: s.attributes[c.STEP_INDEX.key])  # fmt: skip


def _children(spans: list[Any], parent: Any) -> list[Any]:
    pid = parent.context.span_id
    return sorted((s for s in spans if s.parent is not None and s.parent.span_id == pid),
                  key=lambda s: s.start_time)  # fmt: skip


def _named(spans: list[Any], prefix: str) -> list[Any]:
    """The spans whose name starts with ``prefix``, in start order."""
    return sorted((s for s in spans if s.name.startswith(prefix)), key=lambda s: s.start_time)


def _seconds(phase: Any) -> float:
    """A phase's time as the tables count it: the device's where measured."""
    a = phase.attributes
    return float(a.get(c.PHASE_DEVICE_DURATION.key, a[c.PHASE_HOST_DURATION.key]))


SLEEP_CYCLES = 30_000_000  # (about 15-20 ms on an H100)


def _sleep_seconds() -> float:
    """How long ``torch.cuda._sleep(SLEEP_CYCLES)`` holds the stream, by CUDA events."""
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    torch.cuda._sleep(SLEEP_CYCLES)  # type: ignore[no-untyped-call]
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3


def test_ddps_gradient_wait_on_nccl_is_the_devices_wait(cuda: torch.device, nccl: Any) -> None:
    """Issue 38 item 14: both of ``ddp_all_reduce``'s events were recorded at the end of
    backward, back to back: about 0 however long the bucket held the stream. A comm hook
    that puts a sleep on the stream before its all-reduce makes the wait measurable."""
    sleep_s = _sleep_seconds()
    assert sleep_s > 0.002, f"the sleep took {sleep_s * 1e3:.2f} ms: too short to tell"
    ddp = torch.nn.parallel.DistributedDataParallel(mlp(cuda, 256)[0], device_ids=[cuda.index])

    def slow_bucket(state, bucket):  # type: ignore[no-untyped-def]  # (DDP reads
        # annotations, which are strings under this module's __future__ import)
        torch.cuda._sleep(SLEEP_CYCLES)  # type: ignore[no-untyped-call]  # (its current stream)
        work = nccl.all_reduce(bucket.buffer(), async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    ddp.register_comm_hook(None, slow_bucket)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    tel = InMemoryTelemetry()
    session = _start(tel, ddp, opt)
    x = torch.randn(64, 256, device=cuda)
    for _ in range(5):
        loss = ddp(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    _end(session)
    waits = _named(tel.spans(), "ddp_all_reduce")
    assert len(waits) == 5, [(s.name, dict(s.attributes)) for s in waits]
    for span in waits[1:]:  # (the first step binds the device)
        assert span.attributes[c.PHASE_CLOCK.key] == "device"
        waited = span.attributes[c.PHASE_DEVICE_DURATION.key]
        assert waited >= 0.5 * sleep_s, (waited, sleep_s)


def test_a_dtensor_loss_on_cuda_is_recorded(cuda: torch.device, nccl: Any) -> None:
    """Issue 38 item 5: ``copy_`` of a DTensor loss into the pinned buffer raised, and
    recording went off for the run. loss_parallel's loss on a one-rank NCCL mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = init_device_mesh("cuda", (1,))
    torch.manual_seed(0)
    logits = distribute_tensor(torch.randn(4, 10, device=cuda, requires_grad=True), mesh,
                               [Shard(1)])  # fmt: skip
    target = torch.randint(0, 10, (4,), device=cuda)
    with loss_parallel():
        loss = torch.nn.functional.cross_entropy(logits, target)
    assert isinstance(loss, DTensor)
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", tracer_provider=tel.tracer_provider,
                         meter_provider=tel.meter_provider)  # fmt: skip
    session = otel_train.session.current()
    assert session is not None
    with otel_train.step(samples=4):
        torch.cuda.set_sync_debug_mode("error")  # (no read of the device to record it)
        try:
            otel_train.record(loss=loss)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    _end(session)
    expected = torch.nn.functional.cross_entropy(logits.full_tensor(), target).item()
    got = [p.value for p in tel.points(c.SCALAR.name) if p.attributes.get("name") == "loss"]
    assert got == [pytest.approx(expected)]


class Checkpointed(torch.nn.Module):
    """Four layers, each recomputed in backward by reentrant checkpointing."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(4))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=True)
        out: torch.Tensor = self.head(x)
        return out


def test_reentrant_checkpointing_on_cuda_gives_one_backward_a_step(cuda: torch.device) -> None:
    """Issue 38 item 7: checkpointing's inner ``torch.autograd.backward`` calls run on the
    autograd device thread on CUDA; they became top-level backward rows, and the phases'
    shares of the step passed 100%."""
    torch.manual_seed(0)
    model = Checkpointed(256).to(cuda)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 256, generator=g),
                                          torch.randn(48, 1, generator=g))  # fmt: skip
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    tel = InMemoryTelemetry()
    session = _start(tel, model, opt, dataloader=loader)
    for x, y in loader:
        x, y = x.to(cuda).requires_grad_(), y.to(cuda)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    _end(session)
    spans = tel.spans()
    steps = _steps(spans)
    assert len(steps) == len(loader)
    assert sum(s.name == "backward" for s in spans) == len(loader)
    phase_total = step_total = 0.0
    for step in steps:
        top = _children(spans, step)
        assert sorted(p.name for p in top) == ["backward", "data", "forward", "optimizer"]
        (backward,) = [p for p in top if p.name == "backward"]
        assert _children(spans, backward) == []
        phase_total += sum(_seconds(p) for p in top)
        step_total += step.attributes[c.STEP_HOST_DURATION.key]
    # The console's "% step": top-level phases' time (the device's where measured) over
    # the steps' host time.
    assert phase_total <= step_total, (phase_total, step_total)


def test_a_plain_loop_on_cuda_is_stamped_one_event_a_boundary(
    cuda: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: once the device is timed, the training thread records one CUDA event per
    boundary (its stamp), not two per phase and one at each step's ends."""
    main = threading.current_thread()
    counts = {"events": 0}
    record = torch.cuda.Event.record  # (torch's: the stamp calls it, in C or Python)

    def counted_record(self: Any, *args: Any) -> Any:
        counts["events"] += int(threading.current_thread() is main)
        return record(self, *args)

    monkeypatch.setattr(torch.cuda.Event, "record", counted_record)
    model, opt = mlp(cuda, 256)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 256, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    tel = InMemoryTelemetry()
    session = _start(tel, model, opt, dataloader=loader)

    def epoch() -> None:
        for (x,) in loader:
            loss = model(x.to(cuda, non_blocking=True)).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    epoch()  # (the first step applied at once binds the device)
    rec = session.recorder
    assert rec.stamping
    taken, recorded = rec.stamps_taken(), counts["events"]
    epochs = 4
    for _ in range(epochs):
        epoch()
    stamps, events = rec.stamps_taken() - taken, counts["events"] - recorded
    print(f"per step: stamps {stamps / (epochs * len(loader)):.2f}, "
          f"events {events / (epochs * len(loader)):.2f}")  # fmt: skip
    assert stamps > 0
    assert events == stamps
    _end(session)
    spans = tel.spans()
    iterations = (epochs + 1) * len(loader)
    assert len(_steps(spans)) == iterations
    timed = epochs * len(loader)
    for name in ("forward", "backward", "optimizer"):
        rows = _named(spans, name)
        assert len(rows) == iterations
        assert {s.attributes[c.PHASE_CLOCK.key] for s in rows[-timed:]} == {"device"}
