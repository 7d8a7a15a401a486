"""What a plain loop counts is what its steps consumed, whatever the order it fetches its
batches in (issue 25 item 2).

A nanoGPT-style character model (token ids in, next-token logits out) trained with
gradient accumulation, an evaluation region at the top of every fourth iteration and a
``count_batch=`` rule, in four loop orders (ORDERS): each micro-batch fetched at the top
of its micro-step; one fetched ahead before the loop and the next after each optimizer
step (the last one never trained on); nanoGPT's own, the next micro-batch fetched
between the forward and the backward; and after the backward (in these two the last
one, never trained on, is fetched inside the last step). Each step then counts its own
micro-batches, and the run the ones trained on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from otel_helpers import providers, step_spans

import otel_train
from otel_train import contract as c
from otel_train.runs import record_data
from otel_train.testing import InMemoryTelemetry

VOCAB, SEQ, BATCH, ACCUM, ITERS = 65, 32, 4, 3, 8


class CharModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(x))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def _loader() -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, VOCAB, ((ITERS * ACCUM + 2) * BATCH, SEQ + 1), generator=g)
    data = torch.utils.data.TensorDataset(text[:, :-1], text[:, 1:])
    return torch.utils.data.DataLoader(data, batch_size=BATCH)


# Where each micro-batch is fetched: at the top of its micro-step (``for`` over the
# loader); one ahead, the next after the optimizer step (the last never trained on);
# nanoGPT's, between the forward and the backward; after the backward. The last two
# fetch the last batch, never trained on, inside the last step.
ORDERS = ("micro_step", "after_optimizer", "after_forward", "after_backward")


def train(model: CharModel, opt: Any, it: Iterator[Any], top: Callable[[int], None],
          fetch: str) -> int:  # fmt: skip
    """ITERS optimizer steps of ACCUM micro-batches, fetched as ``fetch`` says; ``top(i)``
    at the top of each iteration. Returns the micro-batches trained on."""
    trained = 0
    if fetch != "micro_step":
        x, y = next(it)  # before the loop
    for i in range(ITERS):
        top(i)
        for m in range(ACCUM):
            if fetch == "micro_step":
                x, y = next(it)
            loss = model(x, y) / ACCUM
            if fetch == "after_forward":
                x, y = next(it)  # while the device would still run the forward
            loss.backward()
            trained += 1
            if fetch == "after_backward" or (fetch == "after_optimizer" and m < ACCUM - 1):
                x, y = next(it)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if fetch == "after_optimizer":
            x, y = next(it)  # the next iteration's first micro-batch
    return trained


@pytest.mark.parametrize("fetch", ORDERS)
def test_each_step_counts_the_micro_batches_it_trained_on(fetch: str) -> None:
    tel = InMemoryTelemetry()
    torch.manual_seed(0)
    model = CharModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = _loader()
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          trace_steps="all", flops="off", **providers(tel),
                          count_batch=lambda b: (b[0].shape[0], b[0].numel()))  # fmt: skip
    x_eval, y_eval = next(iter(_loader()))  # (another loader: not the instrumented one)

    def evaluate(i: int) -> None:
        if i % 4 == 0:
            with otel_train.region("evaluation"), torch.no_grad():
                model.eval()
                model(x_eval, y_eval)
                model.train()

    trained = train(model, opt, iter(loader), evaluate, fetch)
    otel_train.shutdown()

    assert trained == ITERS * ACCUM
    sums = {m: sum(p.value for p in tel.points(m)) for m in (c.STEPS.name, c.SAMPLES.name,
                                                            c.TOKENS.name)}  # fmt: skip
    assert sums == {c.STEPS.name: ITERS, c.SAMPLES.name: trained * BATCH,
                    c.TOKENS.name: trained * BATCH * SEQ}  # fmt: skip
    steps = step_spans(tel.spans())
    assert [s.attributes[c.STEP_SAMPLES.key] for s in steps] == [ACCUM * BATCH] * ITERS
    assert [s.attributes[c.STEP_TOKENS.key] for s in steps] == [ACCUM * BATCH * SEQ] * ITERS
    run_time = {p.attributes[c.A_CATEGORY]: p.value for p in tel.points(c.RUN_TIME.name)}
    assert run_time["evaluation"] > 0


def test_nanogpts_order_counts_the_same_through_the_sidecar(tmp_path: Path) -> None:
    """The sidecar replays the same log (raw, or the steps it recognises): its run
    record's step spans and counters say the same."""
    torch.manual_seed(0)
    model = CharModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = _loader()
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          trace_steps="all", flops="off", prometheus=False,
                          run_dir=str(tmp_path), service_name="orders")  # fmt: skip
    assert otel_train.session.current().feeder is not None
    trained = train(model, opt, iter(loader), lambda i: None, "after_forward")
    assert otel_train.shutdown()
    (rank,) = record_data.load(next(tmp_path.iterdir()))
    steps = [s for s in rank.spans if s["name"] == c.STEP_SPAN.name]
    assert [s["attributes"][c.STEP_SAMPLES.key] for s in steps] == [ACCUM * BATCH] * ITERS
    samples = rank.snapshots[-1].values[(c.SAMPLES.name, ())]
    assert samples == trained * BATCH
