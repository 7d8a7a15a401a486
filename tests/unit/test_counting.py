"""Steps and counts of plain loops: token-id batches, and a loop given no optimizer."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from otel_helpers import fetch_ahead_loop, providers, tiny_loader, tiny_model

import otel_train
from otel_train import contract as c
from otel_train.adapters.batches import count_batch
from otel_train.testing import InMemoryTelemetry

IDS = torch.randint(0, 100, (4, 16))


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        ((IDS, IDS), (4, 64)),  # nanoGPT's (x, y) of token ids
        ([IDS, IDS], (4, 64)),
        (IDS, (4, 64)),
        ((torch.randn(4, 16), torch.randn(4, 1)), (4, None)),  # features: no tokens
        ((torch.randint(0, 9, (4,)), torch.randn(4)), (4, None)),  # one id per sample
        ((torch.ones(4, 16, dtype=torch.bool),), (4, None)),  # a mask is no token ids
        ({"input_ids": IDS}, (4, 64)),
        ({"input_ids": IDS, "attention_mask": torch.ones(4, 16)[:, :10]}, (4, 40)),
        ([{"x": IDS}], (4, 64)),  # nested: the first tensor found
    ],
)
def test_count_batch_counts_token_ids_by_the_documented_rule(
    batch: Any, expected: tuple[int | None, int | None]
) -> None:
    assert count_batch(batch) == expected


def _sums(tel: InMemoryTelemetry) -> dict[str, float]:
    metrics = tel.metrics()
    return {
        name: sum(p.value for p in metrics[name].data.data_points)
        for name in (c.STEPS.name, c.SAMPLES.name, c.TOKENS.name)
        if name in metrics
    }


def test_a_loop_of_token_id_batches_reports_its_tokens() -> None:
    tel = InMemoryTelemetry()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 100))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randint(0, 100, (32, 16)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, console="off", flops="off", **providers(tel)
    )
    for (x,) in loader:
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert otel_train.flush(10.0)
    sums = _sums(tel)
    otel_train.shutdown()
    assert sums == {c.STEPS.name: 4, c.SAMPLES.name: 32, c.TOKENS.name: 32 * 16}


def test_without_an_optimizer_each_batch_fetch_begins_a_step() -> None:
    """``instrument(model, dataloader=dl)`` with the optimizer forgotten: 16 batches
    trained on are 16 steps, not one step of the whole run."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=64, batch_size=8)
    otel_train.instrument(model, dataloader=loader, console="off", flops="off", **providers(tel))
    for _ in range(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert otel_train.flush(10.0)
    sums = _sums(tel)
    phases = {
        p.attributes[c.A_PHASE]: p.count
        for p in tel.metrics()[c.PHASE_DURATION.name].data.data_points
    }
    otel_train.shutdown()
    assert sums == {c.STEPS.name: 16, c.SAMPLES.name: 128}
    assert phases == {"data": 16, "forward": 16, "backward": 16}


def test_a_batch_fetched_but_never_trained_on_is_not_counted() -> None:
    """nanoGPT's order: the first batch before the loop, the next one at the end of each
    iteration, so the last fetch is never trained on."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=64, batch_size=8)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, console="off", flops="off", **providers(tel)
    )
    fetch_ahead_loop(model, opt, loader, 6)
    otel_train.shutdown()
    assert _sums(tel) == {c.STEPS.name: 6, c.SAMPLES.name: 48}
