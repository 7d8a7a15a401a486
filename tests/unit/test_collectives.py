"""The collectives' wrappers (adapters/collectives.py) inside torch.compile: Dynamo traces
through them to torch's own collective, as it would without otel-train."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
from otel_helpers import providers, single_rank_group, tiny_model
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
