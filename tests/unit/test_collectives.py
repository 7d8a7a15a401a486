"""The collectives' wrappers (adapters/collectives.py) inside torch.compile: Dynamo traces
through them to torch's own collective, as it would without otel-train."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
from otel_helpers import providers, single_rank_group, step_spans, tiny_model
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

import otel_train
from otel_train.testing import InMemoryTelemetry


@pytest.fixture
def dist() -> Iterator[Any]:
    with single_rank_group() as dist:
        yield dist


def compiled_reduce(dist: Any, fullgraph: bool) -> tuple[torch.Tensor, int, int, int]:
    """A function calling ``dist.all_reduce``, compiled: (its result, graph breaks,
    graphs, ops in them), from a fresh Dynamo."""
    torch._dynamo.reset()
    counters.clear()

    def scaled_sum(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    backend = CompileCounter()
    out = torch.compile(scaled_sum, backend=backend, fullgraph=fullgraph)(torch.ones(4))
    breaks = sum(counters["graph_break"].values())
    return out, breaks, backend.frame_count, backend.op_count


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_compiled_collective_traces_as_without_otel_train(dist: Any, fullgraph: bool) -> None:
    expected = compiled_reduce(dist, fullgraph)
    model, opt = tiny_model()
    otel_train.instrument(model, optimizer=opt, console="off", **providers(InMemoryTelemetry()))
    assert dist.all_reduce.__wrapped__ is not None  # (the wrapper is the one traced)
    out, *counts = compiled_reduce(dist, fullgraph)
    otel_train.shutdown()
    torch._dynamo.reset()
    assert torch.equal(out, expected[0])
    assert counts == list(expected[1:])
    assert counts[0] == 0  # (and without otel-train: no graph break)


class RowParallel(torch.nn.Module):
    """Megatron's row-parallel linear layer: each rank's partial product summed over the
    tensor-parallel group (here gloo with one rank) by an ``all_reduce`` in forward."""

    def __init__(self, dist: Any) -> None:
        super().__init__()
        self.dist = dist
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.dist.all_reduce(y)
        return y


def train_compiled(dist: Any, tel: InMemoryTelemetry | None) -> dict[str, torch.Tensor]:
    """4 steps of a RowParallel model compiled with torch.compile's defaults (inductor),
    instrumented first when ``tel`` is given; the trained weights."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = RowParallel(dist)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if tel is not None:
        otel_train.instrument(model, optimizer=opt, console="off", trace_steps="all",
                              **providers(tel))  # fmt: skip
    compiled = torch.compile(model)
    for _ in range(4):
        loss = compiled(torch.randn(2, 8)).square().sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    otel_train.shutdown()
    assert sum(counters["graph_break"].values()) == 0
    return model.state_dict()


def test_a_model_with_a_collective_compiled_by_default_trains_as_without(dist: Any) -> None:
    """Issue 38 item 1 with torch.compile's default backend, in a training loop: the
    same weights as without otel-train, no graph break, one step an iteration."""
    expected = train_compiled(dist, None)
    tel = InMemoryTelemetry()
    state = train_compiled(dist, tel)
    torch._dynamo.reset()
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    assert len(step_spans(tel.spans())) == 4
