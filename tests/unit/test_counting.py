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


class _PaddedDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Token-id samples padded to 16, each with its own number of real tokens."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        real = 3 + (i * 5) % 13
        mask = torch.zeros(16, dtype=torch.long)
        mask[:real] = 1
        return {"input_ids": torch.randint(0, 50, (16,)), "attention_mask": mask}


def test_padded_batches_key_flops_by_the_padded_shape() -> None:
    """Issue 13 item 6: compute follows the padded shape. Every batch is (4, 16) padded
    with its own mask: one count, the same FLOPs for every step, tokens from the masks."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 32), torch.nn.Linear(32, 50))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(_PaddedDataset(), batch_size=4)
    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, dataloader=loader, trace_steps="all",
                          console="off", **providers(tel))  # fmt: skip
    masks = 0
    for _ in range(2):
        for batch in loader:
            masks += int(batch["attention_mask"].sum())
            model(batch["input_ids"]).float().mean().backward()
            opt.step()
            opt.zero_grad()
    otel_train.shutdown()
    steps = sorted(
        (s.attributes for s in tel.spans() if s.name == c.STEP_SPAN.name),
        key=lambda a: a[c.STEP_INDEX.key],
    )
    assert len(steps) == 16
    flops = {a[c.STEP_FLOPS.key] for a in steps[1:]}  # (step 0 is never counted)
    assert len(flops) == 1, flops
    assert [a[c.STEP_INDEX.key] for a in steps if a.get(c.STEP_FLOPS_COUNTED.key)] == [1]
    assert {a[c.STEP_FLOPS_SOURCE.key] for a in steps[1:]} == {"counted"}
    assert sum(a[c.STEP_TOKENS.key] for a in steps) == masks  # throughput: real tokens
    assert len({a[c.STEP_TOKENS.key] for a in steps}) > 1


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        ({"input_ids": IDS, "attention_mask": torch.ones(4, 16)[:, :10]}, (4, 40, 64)),
        ({"input_ids": IDS}, (4, 64, 64)),
        ((IDS, IDS), (4, 64, 64)),
        ((torch.randn(4, 16),), (4, None, None)),
    ],
)
def test_batch_counts_give_padded_tokens_beside_tokens(
    batch: Any, expected: tuple[int | None, ...]
) -> None:
    from otel_train.adapters.batches import batch_counts

    assert batch_counts(batch) == expected
