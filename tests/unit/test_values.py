"""Scalars handed to the recorder (recording/values.py): a DTensor loss (tensor
parallelism's ``loss_parallel``) is recorded at its value, from its local tensor, without
a collective or a host-device sync; one whose value lies across ranks is not read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import cuda_standin
import pytest
import torch
from cuda_standin import cuda_scalar, pinned_on_cpu
from otel_helpers import providers, single_rank_group, value
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel

import otel_train
from otel_train import contract as c
from otel_train.recording import values
from otel_train.testing import InMemoryTelemetry


@pytest.fixture
def mesh() -> Iterator[Any]:
    """A one-rank gloo device mesh on the CPU."""
    with single_rank_group():
        yield init_device_mesh("cpu", (1,))


def record_loss(loss: Any) -> tuple[InMemoryTelemetry, bool]:
    """Record ``loss`` in one step: the telemetry, and whether recording stayed on."""
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", **providers(tel))
    session = otel_train.session.current()
    assert session is not None
    with otel_train.step(samples=4):
        otel_train.record(loss=loss)
    otel_train.flush()
    enabled = session.recorder.enabled
    otel_train.shutdown()
    return tel, enabled


def test_a_loss_parallel_loss_is_recorded_at_its_value(mesh: Any) -> None:
    torch.manual_seed(0)
    logits = distribute_tensor(torch.randn(4, 10, requires_grad=True), mesh, [Shard(1)])
    target = torch.randint(0, 10, (4,))
    with loss_parallel():
        loss = torch.nn.functional.cross_entropy(logits, target)
    assert isinstance(loss, DTensor)
    tel, enabled = record_loss(loss)
    assert enabled
    expected = torch.nn.functional.cross_entropy(logits.full_tensor(), target).item()
    assert value(tel, c.SCALAR.name, name="loss") == pytest.approx(expected)


def test_a_dtensor_loss_on_cuda_is_copied_from_its_local_tensor(
    mesh: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA path copies the loss to pinned memory behind an event: a DTensor's own
    ``copy_`` into a plain tensor raised there, and recording went off for the run."""
    loss = DTensor.from_local(cuda_scalar(2.5), mesh, [Replicate()])
    monkeypatch.setattr(DTensor, "is_cuda", property(lambda self: True))  # (as on a GPU)
    pinned_on_cpu(monkeypatch)
    with cuda_standin.installed(monkeypatch) as rt:
        tel, enabled = record_loss(loss)
    assert enabled, "recording switched itself off"
    assert rt.events, "the loss was not copied behind an event"
    assert value(tel, c.SCALAR.name, name="loss") == 2.5


def test_a_dtensor_whose_value_lies_across_ranks_is_not_read(
    mesh: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pending sum (``Partial``) is read only through a collective: not by telemetry."""
    monkeypatch.setattr(values, "_across_said", [])  # (said once a process: here, a test)
    partial = DTensor.from_local(torch.tensor(1.5), mesh, [Partial()])
    tel, enabled = record_loss(partial)
    assert enabled
    assert value(tel, c.SCALAR.name, name="loss") is None
    assert sum("across ranks" in r.getMessage() for r in caplog.records) == 1
