"""torch.compile: instrumenting causes no recompilation per step and no graph break.

Counted with torch's own counters: ``torch._dynamo.testing.CompileCounter`` as the
backend (frames compiled, ops per graph) and ``torch._dynamo.utils.counters`` (graph
breaks, unique graphs), compared with the same loop uninstrumented. Both orders are
checked: compile then ``instrument()`` the compiled module, and ``instrument()`` then
compile (our hooks are traced by Dynamo in that order).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
from otel_helpers import providers, tiny_loader
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

import otel_train
from otel_train import contract as c
from otel_train.runs.record_data import load_run
from otel_train.testing import InMemoryTelemetry

STEPS = 6


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train(compiled: Any, opt: torch.optim.Optimizer, loader: Any) -> list[tuple[int, int]]:
    """Steps over the loader; (frames compiled, graph breaks) after each step."""
    seen = []
    backend = compiled._otel_test_backend
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen.append((backend.frame_count, sum(counters["graph_break"].values())))
    return seen


def compile_with_counter(model: torch.nn.Module) -> Any:
    backend = CompileCounter()
    compiled = torch.compile(model, backend=backend)
    compiled._otel_test_backend = backend
    return compiled


def baseline() -> tuple[list[tuple[int, int]], int]:
    model, opt = model_and_optimizer()
    compiled = compile_with_counter(model)
    seen = train(compiled, opt, tiny_loader(n=8 * STEPS))
    ops = compiled._otel_test_backend.op_count
    torch._dynamo.reset()
    counters.clear()
    return seen, ops


def phase_names(tel: InMemoryTelemetry) -> set[str]:
    return {s.name for s in tel.spans()} - {c.STEP_SPAN.name}


def step_count(tel: InMemoryTelemetry) -> int:
    return len([s for s in tel.spans() if s.name == c.STEP_SPAN.name])


def test_instrumenting_a_compiled_model() -> None:
    expected, expected_ops = baseline()
    model, opt = model_and_optimizer()
    compiled = compile_with_counter(model)
    tel = InMemoryTelemetry()
    loader = tiny_loader(n=8 * STEPS)
    otel_train.instrument(
        compiled, optimizer=opt, dataloader=loader, **providers(tel), console="off",
        trace_steps="all",
    )  # fmt: skip
    seen = train(compiled, opt, loader)
    otel_train.shutdown()

    assert seen == expected  # same frames compiled, once; no graph break; nothing per step
    assert seen[-1] == (1, 0)
    assert compiled._otel_test_backend.op_count == expected_ops
    assert step_count(tel) == STEPS
    assert phase_names(tel) == {"data", "forward", "backward", "optimizer"}


@pytest.mark.parametrize("with_loader", [True, False])
def test_compiling_an_instrumented_model(with_loader: bool) -> None:
    expected, expected_ops = baseline()
    model, opt = model_and_optimizer()
    tel = InMemoryTelemetry()
    loader = tiny_loader(n=8 * STEPS)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader if with_loader else None, **providers(tel),
        console="off", trace_steps="all",
    )  # fmt: skip
    compiled = compile_with_counter(model)
    seen = train(compiled, opt, loader)
    otel_train.shutdown()

    assert seen == expected
    assert counters["graph_break"] == {}  # our hooks are traced without a break
    assert compiled._otel_test_backend.op_count == expected_ops
    # Steps are still recorded; the forward pass runs inside the compiled region, so no
    # hook times it: with a loader the fetch opens each step and the forward has no phase;
    # without one each step opens where the last one ended, with a forward phase up to
    # backward, so that step time (and MFU) includes the forward (docs/rationale.md).
    assert step_count(tel) == STEPS
    wanted = {"backward", "optimizer"} | ({"data"} if with_loader else {"forward"})
    assert phase_names(tel) == wanted
    if not with_loader:
        steps = sorted(
            (s for s in tel.spans() if s.name == c.STEP_SPAN.name),
            key=lambda s: s.attributes[c.STEP_INDEX.key],
        )
        for step in steps[1:]:  # (the first opened at its backward: compiling came first)
            (forward,) = [s for s in tel.spans() if s.name == "forward"
                          and s.parent.span_id == step.context.span_id]  # fmt: skip
            assert forward.start_time == step.start_time


def test_module_compile_in_place_after_instrument() -> None:
    """``model.compile()`` compiles ``_call_impl`` with our hooks in it, like torch.compile."""
    expected, _ = baseline()
    model, opt = model_and_optimizer()
    tel = InMemoryTelemetry()
    loader = tiny_loader(n=8 * STEPS)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, **providers(tel), console="off",
        trace_steps="all",
    )  # fmt: skip
    backend = CompileCounter()
    model.compile(backend=backend)
    model._otel_test_backend = backend  # type: ignore[assignment]
    seen = train(model, opt, loader)
    otel_train.shutdown()
    assert seen == expected
    assert step_count(tel) == STEPS


@pytest.mark.parametrize("consumer", ["sidecar", "thread"])
def test_the_compile_state_is_exported_once_a_compiled_forward_ran(
    consumer: str, tmp_path: Path
) -> None:
    """otel_train.torch.compiled (the live stack's torch.compile run fact), as otel-train's
    own SDK exports it: 0 while the model runs eagerly, 1 once it ran compiled (the
    sidecar told of the change by the training process)."""
    model, opt = model_and_optimizer()
    otel_train.instrument(model, optimizer=opt, console="off", prometheus=False,
                          run_dir=str(tmp_path), metric_export_interval=0.1,
                          sidecar="auto" if consumer == "sidecar" else "off")  # fmt: skip
    assert (otel_train.session.current().feeder is not None) == (consumer == "sidecar")
    for x, y in tiny_loader(n=8 * 2):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert otel_train.flush()
    train(compile_with_counter(model), opt, tiny_loader(n=8 * 2))
    assert otel_train.shutdown()
    (rank,) = load_run(str(tmp_path)).ranks
    key = (c.TORCH_COMPILED.name, ())
    seen = [snap.values[key] for snap in rank.snapshots if key in snap.values]
    assert seen[0] == 0.0 and seen[-1] == 1.0, seen


def test_dynamo_explain_finds_no_break_in_an_instrumented_module() -> None:
    model, opt = model_and_optimizer()
    otel_train.instrument(model, optimizer=opt, **providers(InMemoryTelemetry()), console="off")
    explanation = torch._dynamo.explain(model)(torch.randn(4, 8))
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1


def test_inductor_compiles_once_with_otel_train_on() -> None:
    """The real backend (CPU inductor, ~25 s on a cold cache): one graph, no break, and
    nothing compiled again after the first step."""
    model, opt = model_and_optimizer()
    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, **providers(tel), console="off")
    compiled = torch.compile(model)
    graphs = []
    for x, y in tiny_loader(n=8 * 4):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        graphs.append((counters["stats"]["unique_graphs"], counters["frames"]["total"]))
    otel_train.shutdown()
    assert graphs == [graphs[0]] * 4 and graphs[0][0] == 1
    assert counters["graph_break"] == {}
    assert step_count(tel) >= 1


def test_a_forward_replaced_after_instrument_like_make_graphed_callables() -> None:
    """``torch.cuda.make_graphed_callables(model, ...)`` sets the graphed forward as the
    model's own ``forward``, over ours (a CUDA twin runs in tests/gpu): no hook of ours
    runs in it, and without a loader no step would open again. The step that shows it is
    lost (it ran before its end showed it); each one after opens where the last ended."""
    model, opt = model_and_optimizer()
    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, **providers(tel), console="off",
                          trace_steps="all")  # fmt: skip
    batches = list(tiny_loader(n=8 * 8))

    def steps(batches: list[Any]) -> None:
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    steps(batches[:3])
    original = model.__class__.forward  # (the model's class's own: no timing in it)
    model.forward = lambda x: original(model, x)  # (what a graphed forward does here)
    steps(batches[3:])
    otel_train.shutdown()
    assert step_count(tel) == 3 + 4
    assert phase_names(tel) == {"forward", "backward", "optimizer"}
