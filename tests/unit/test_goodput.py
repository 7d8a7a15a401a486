"""Goodput's split of the wall time: every instant counts once, shares sum to 100%."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from otel_helpers import fetch_ahead_loop, providers, tiny_loader, tiny_model

import otel_train
from otel_train.processing.goodput import Goodput
from otel_train.testing import InMemoryTelemetry


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in _union(intervals))


def _inside(a: int, b: int, union: list[tuple[int, int]]) -> int:
    return sum(max(0, min(b, hi) - max(a, lo)) for lo, hi in union)


@st.composite
def timelines(draw: Any) -> dict[str, Any]:
    """Steps one after another (each starting with its data fetch), gaps between them,
    and regions anywhere: inside a step, across steps, nested in each other."""
    t, steps = 0, []
    for _ in range(draw(st.integers(1, 12))):
        t += draw(st.integers(0, 50))
        length = draw(st.integers(1, 100))
        data = draw(st.integers(0, length))
        steps.append((t, t + length, data))
        t += length
    regions = []
    for _ in range(draw(st.integers(0, 6))):
        a = draw(st.integers(0, t + 50))
        b = a + draw(st.integers(1, 120))
        regions.append((draw(st.sampled_from(["evaluation", "checkpoint"])), a, b))
    cuts = draw(st.lists(st.integers(0, t + 200), max_size=4))
    return {"steps": steps, "regions": regions, "cuts": sorted(cuts)}


@given(timelines())
def test_shares_sum_to_the_wall_time_and_each_instant_counts_once(tl: dict[str, Any]) -> None:
    """Fed as the worker feeds it: in batches cut at random times, each batch's regions
    (those ended by then) first, then its steps (those ended by then) as one block."""
    g = Goodput()
    steps, regions = tl["steps"], tl["regions"]
    pending_steps, pending_regions = list(steps), sorted(regions, key=lambda r: r[2])
    for cut in [*tl["cuts"], 10**9]:
        while pending_regions and pending_regions[0][2] <= cut:
            kind, a, b = pending_regions.pop(0)
            g.add_region(kind, a, b)
        block = [s for s in pending_steps if s[1] <= cut]
        if block:
            pending_steps = pending_steps[len(block) :]
            starts, ends = [s[0] for s in block], [s[1] for s in block]
            spans = [(e - a) / 1e9 for a, e in zip(starts, ends, strict=True)]
            g.add_steps(starts, ends, spans, [s[2] / 1e9 for s in block])
    totals = g.totals()
    marks = [s[0] for s in steps] + [r[1] for r in regions]
    ends = [s[1] for s in steps] + [r[2] for r in regions]
    wall = (max(ends) - min(marks)) / 1e9
    assert g.wall() == pytest.approx(wall)
    assert all(v >= 0 for v in totals.values()), totals
    assert sum(totals.values()) == pytest.approx(wall, abs=1e-12)
    covered = _union([(a, b) for _, a, b in regions])
    in_regions = totals["evaluation"] + totals["checkpoint"]
    assert in_regions == pytest.approx(_length([(a, b) for _, a, b in regions]) / 1e9, abs=1e-12)
    outside = sum(e - s - _inside(s, e, covered) for s, e, _ in steps) / 1e9
    assert totals["train"] + totals["data"] == pytest.approx(outside, abs=1e-12)
    assert totals["data"] <= sum(d for _, _, d in steps) / 1e9 + 1e-12


def test_evaluation_inside_an_open_step_is_not_train_time() -> None:
    """nanoGPT's order: the first batch is fetched before the loop (its fetch opens the
    step), estimate_loss() runs in region("evaluation") at the top of each iteration,
    and the next batch is fetched at the end of it."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=64, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off", flops="off",
                          sidecar="off", **providers(tel))  # fmt: skip
    session = otel_train.session.current()
    assert session is not None
    evaluated = []

    def evaluate(i: int) -> None:
        if i % 2 == 0:
            t0 = time.perf_counter()
            with otel_train.region("evaluation"), torch.no_grad():
                time.sleep(0.03)
            evaluated.append(time.perf_counter() - t0)

    fetch_ahead_loop(model, opt, loader, 6, top=evaluate)
    otel_train.shutdown()
    shares = session.efficiency.goodput_shares()
    assert shares is not None
    wall, share = shares
    assert sum(share.values()) == pytest.approx(1.0, abs=1e-9)
    assert share["evaluation"] * wall == pytest.approx(sum(evaluated), abs=0.005)
    assert share["train"] < 1.0 - share["evaluation"]


def test_the_summary_says_what_each_wall_time_covers(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38 item 16: "wall clock 63.44 s" beside "goodput of 68.40 s": the first is
    the steps' span, the second reaches an evaluation after the last step. Each says so."""
    otel_train.configure(console="stderr", console_every=0, **providers(InMemoryTelemetry()))
    for _ in range(3):
        with otel_train.step(samples=1):
            time.sleep(0.01)
    with otel_train.region("evaluation"):
        time.sleep(0.2)
    otel_train.shutdown()
    text = capsys.readouterr().err
    wall = re.search(r"wall clock ([\d.]+) ms \(first step to last\)", text)
    goodput = re.search(r"goodput [\d.]+% of ([\d.]+) ms \(first step or region to last\)", text)
    assert wall is not None and goodput is not None, text
    assert float(goodput.group(1)) > float(wall.group(1)) + 150  # (the evaluation's 200 ms)
