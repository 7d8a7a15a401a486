"""The console's tables from batches of steps: the worker hands it whole batches."""

from __future__ import annotations

import contextlib
import io
import random

import pytest

from otel_train.processing.blocks import group_steps
from otel_train.processing.console import ConsoleReporter
from otel_train.processing.resolved import finished_step
from otel_train.recording.layouts import Step


def _steps(n: int, seed: int = 3) -> list[Step]:
    rnd = random.Random(seed)
    out, t = [], 1_000_000
    for i in range(n):
        rows, start = [], t
        for seq, (name, parent) in enumerate((("data", -1), ("forward", -1), ("loss", 1),
                                              ("backward", -1), ("optimizer", -1))):  # fmt: skip
            d = rnd.randint(1_000, 900_000)
            memory = (rnd.randint(1, 1 << 30), 0, 0, 0) if name == "forward" else None
            rows.append((seq, parent, name, t, t + d, None, None, memory, None, d / 1e9))
            t += d
        step = finished_step(i, start, t)
        step.phases, step.samples = rows, 32
        step.scalars = [("loss", 1.0 / (i + 1))]
        out.append(step)
        t += rnd.randint(0, 50_000)
    return out


def _printed(every: int, batches: list[list[Step]]) -> str:
    console = ConsoleReporter(every, "stdout")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # the console writes to sys.stdout as it is then
        for batch in batches:  # (consecutive steps of one shape share a block)
            for block in group_steps(batch, {}):
                console.add(block)
        console.print_summary()
    return out.getvalue()


@pytest.mark.parametrize("every", [0, 1, 7, 50])
def test_batches_crossing_window_ends_print_what_single_steps_print(every: int) -> None:
    steps = _steps(53)
    one_by_one = _printed(every, [[s] for s in steps])
    rnd = random.Random(every)
    batches, i = [], 0
    while i < len(steps):  # uneven batches, some far larger than a window
        k = rnd.randint(1, 30)
        batches.append(steps[i : i + k])
        i += k
    assert _printed(every, batches) == one_by_one
    assert one_by_one.count("otel-train  steps ") == (len(steps) // every if every else 0)
    assert "53 steps" in one_by_one and "  loss" in one_by_one  # nested row in the summary


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("ranks", ["first", "all"])
def test_several_ranks_print_by_console_ranks(
    rank: int, ranks: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``first``: rank 0 alone prints; ``all``: every rank, each table and summary
    naming its rank."""
    from otel_helpers import providers, tiny_loader, tiny_model, train_epoch

    import otel_train
    from otel_train.testing import InMemoryTelemetry

    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=40, batch_size=8)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, console="stdout", console_every=5,
        console_ranks=ranks, **providers(tel),
    )  # fmt: skip
    train_epoch(model, opt, loader)
    otel_train.shutdown()
    out = capsys.readouterr().out
    if ranks == "first" and rank != 0:
        assert "otel-train" not in out
    elif ranks == "first":
        assert "otel-train  steps 0-4" in out and "otel-train run summary: 5 steps" in out
    else:
        assert f"otel-train [rank {rank}]  steps 0-4" in out
        assert f"otel-train [rank {rank}] run summary: 5 steps" in out
