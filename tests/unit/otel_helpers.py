"""Small helpers shared by the unit tests: a tiny model and data, span-tree queries."""

from __future__ import annotations

import contextlib
import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry


def providers(tel: InMemoryTelemetry) -> dict[str, Any]:
    return {"tracer_provider": tel.tracer_provider, "meter_provider": tel.meter_provider}


def tiny_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def attached(model: torch.nn.Module) -> bool:
    """Whether otel-train times the model's forward: its class is then one made for it,
    which names the model's own as its ``__class__`` (adapters/own_class.py), or the
    instance's own forward is wrapped in place."""
    return type(model) is not model.__class__ or "forward" in vars(model)


def tiny_loader(n: int = 32, batch_size: int = 8, **kwargs: Any) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)
    ds = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, **kwargs)


def train_epoch(
    model: torch.nn.Module, opt: torch.optim.Optimizer, loader: Any, record: bool = False
) -> list[float]:
    """One epoch of a plain loop; ``record`` also hands each loss to ``otel_train.record``."""
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if record:
            otel_train.record(loss=loss)
        losses.append(float(loss.detach()))
    return losses


def step_spans(spans: list[Any]) -> list[Any]:
    return sorted(
        (s for s in spans if s.name == c.STEP_SPAN.name),
        key=lambda s: s.attributes[c.STEP_INDEX.key],
    )


def children_of(spans: list[Any], parent: Any) -> list[Any]:
    """Direct children of ``parent``, in start order."""
    pid = parent.context.span_id
    kids = [s for s in spans if s.parent is not None and s.parent.span_id == pid]
    return sorted(kids, key=lambda s: s.start_time)


def names(spans: list[Any]) -> list[str]:
    return [s.name for s in spans]


def phase_counts(tel: InMemoryTelemetry) -> Counter[str]:
    """phase name -> count of the phase duration histogram (all clocks)."""
    out: Counter[str] = Counter()
    for p in tel.points(c.PHASE_DURATION.name):
        out[p.attributes[c.A_PHASE]] += p.count
    return out


def value(tel: InMemoryTelemetry, metric: str, **attrs: Any) -> float | None:
    """The value of the point of a counter/gauge whose attributes are exactly ``attrs``."""
    for p in tel.points(metric):
        if dict(p.attributes) == attrs:
            return float(p.value)
    return None


def fetch_ahead_loop(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    loader: Any,
    iterations: int,
    top: Any = None,
) -> None:
    """nanoGPT's loop order: the first batch fetched before the loop, ``top(i)`` at the
    top of each iteration (an evaluation, say), the next batch fetched at its end (the
    last one is never trained on)."""
    it = iter(loader)
    x, y = next(it)
    for i in range(iterations):
        if top is not None:
            top(i)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        x, y = next(it)


def sidecar_loop(monkeypatch: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, Any]:
    """A plain loop instrumented at defaults with the sidecar and no OTLP endpoint: the
    model, optimizer, loader (8 batches) and the session."""
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    model, opt = tiny_model()
    loader = tiny_loader(n=64, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, prometheus_port=0,
                          console="off")  # fmt: skip
    sess = otel_train.session.current()
    assert sess is not None and sess.feeder is not None
    return model, opt, loader, sess


def epochs_until_raw(model: torch.nn.Module, opt: torch.optim.Optimizer, loader: Any,
                     handover: Any) -> int:  # fmt: skip
    """Epochs trained until the sidecar's raw session began (at most 200)."""
    epochs = 0
    while not handover.raw and epochs < 200:
        train_epoch(model, opt, loader)
        epochs += 1
    return epochs


@contextlib.contextmanager
def single_rank_group() -> Iterator[Any]:
    """torch.distributed with a gloo group of one rank on loopback, for the block."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()
