"""A nanoGPT-shaped loop (nanogpt_loop.py: gradient accumulation with ``loss / accum``,
the next micro-batch fetched between forward and backward, GradScaler's scale, unscale_,
step and update, an evaluation under ``torch.no_grad()``) with one ``instrument()`` line
and under the zero-code hooks: one step an iteration, each with its micro-batches'
forward and backward phases and their samples and tokens; the evaluation is no step; the
trained weights are bit for bit those of the run without otel-train; and otel-train's
FLOPs a step against nanoGPT's ``estimate_mfu`` formula, printed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from nanogpt_loop import GPT, Config, train
from otel_helpers import children_of, providers, step_spans

import otel_train
from otel_train import contract as c
from otel_train.instrumentor import OtelTrainInstrumentor
from otel_train.testing import InMemoryTelemetry

CFG = Config()
ITERATIONS = CFG.max_iters + 1
# Our count over nanoGPT's formula may differ by this factor either way (0.993x here):
# the formula counts attention as 12*L*H*Q*T a token whatever kernel runs, while the
# counter sees the ops that ran (where a CPU build's flash attention counts 0, issue 38
# item 16 saw 0.86x on nanoGPT's own config; 0.87x on this one), and the formula counts
# 6 FLOPs a token for every parameter, the layer norms' and biases' included, the
# counter for the matmuls' weights. Well outside it: a step counted twice, or one
# micro-batch of two.
FACTOR = 1.25


@contextmanager
def zero_code(tel: InMemoryTelemetry) -> Iterator[None]:
    inst = OtelTrainInstrumentor()
    inst.instrument(tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider)
    try:
        yield
    finally:
        inst.uninstrument()


def run(mode: str, scaler_enabled: bool) -> tuple[InMemoryTelemetry, GPT, int]:
    tel = InMemoryTelemetry()
    settings = {"console": "off", "trace_steps": "all", **providers(tel)}
    if mode == "instrument":

        def instrument(m: GPT, opt: torch.optim.Optimizer) -> None:
            otel_train.instrument(m, optimizer=opt, **settings)  # the one line

        model, iterations = train(CFG, scaler_enabled, instrument)
    else:
        with zero_code(tel):
            otel_train.configure(**settings)
            model, iterations = train(CFG, scaler_enabled)
    otel_train.shutdown()
    return tel, model, iterations


@pytest.mark.parametrize(("mode", "scaler_enabled"), [("instrument", False), ("zero-code", True)])
def test_a_nanogpt_loop_is_counted_as_it_runs(mode: str, scaler_enabled: bool) -> None:
    plain, _ = train(CFG, scaler_enabled)
    tel, model, iterations = run(mode, scaler_enabled)
    assert iterations == ITERATIONS
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == ITERATIONS
    micro = ["forward", "backward"] * CFG.accum
    for step in steps:
        assert [p.name for p in children_of(spans, step)] == [*micro, "optimizer"]
        assert step.attributes[c.STEP_SAMPLES.key] == CFG.batch_size * CFG.accum
        assert step.attributes[c.STEP_TOKENS.key] == CFG.batch_size * CFG.accum * CFG.block_size
    # The evaluation's forwards (no_grad, eval mode) are in no step and no phase
    phases = Counter(s.name for s in spans if s.name != c.STEP_SPAN.name)
    assert phases == {"forward": ITERATIONS * CFG.accum, "backward": ITERATIONS * CFG.accum,
                      "optimizer": ITERATIONS}  # fmt: skip

    state, expected = model.state_dict(), plain.state_dict()
    assert list(state) == list(expected)
    assert all(torch.equal(state[k], expected[k]) for k in expected)

    formula = model.flops_per_iter(CFG.batch_size * CFG.accum)
    counted = {s.attributes[c.STEP_FLOPS.key] for s in steps if c.STEP_FLOPS.key in s.attributes}
    assert len(counted) == 1  # every step of one shape has the count
    ratio = counted.pop() / formula
    print(f"nanoGPT's estimate_mfu formula: {formula:.4g} FLOPs an iteration; "
          f"otel-train's count: {ratio:.3f}x that")  # fmt: skip
    assert 1 / FACTOR <= ratio <= FACTOR
