"""The backward wrapper (adapters/backward.py): reentrant activation checkpointing
(``checkpoint(..., use_reentrant=True)``, what Hugging Face's
``gradient_checkpointing_enable()`` used by default) calls ``torch.autograd.backward``
inside backward; those calls are part of the one ``backward`` phase."""

from __future__ import annotations

import torch
from otel_helpers import children_of, phase_counts, providers, step_spans, tiny_loader
from torch.utils.checkpoint import checkpoint

import otel_train
from otel_train.testing import InMemoryTelemetry

STEPS = 3


class Checkpointed(torch.nn.Module):
    """Four layers, each recomputed in backward by reentrant checkpointing."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=True)
        return self.head(x)


def test_reentrant_checkpointing_gives_one_backward_phase_a_step() -> None:
    tel = InMemoryTelemetry()
    model = Checkpointed()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = tiny_loader(n=8 * STEPS)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          trace_steps="all", **providers(tel))  # fmt: skip
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x.requires_grad_()), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    otel_train.shutdown()
    assert phase_counts(tel)["backward"] == STEPS
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == STEPS
    for step in steps:
        assert [p.name for p in children_of(spans, step)] == [
            "data", "forward", "backward", "optimizer"
        ]  # fmt: skip
        (backward,) = [p for p in children_of(spans, step) if p.name == "backward"]
        assert children_of(spans, backward) == []
