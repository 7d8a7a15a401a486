"""Efficiency figures: FLOPs per step, achieved FLOP/s and MFU, data stall share, goodput.

FLOPs are checked against analytic counts (matmul FLOPs = 2 x M x N x K; backward is
twice forward, less the input-gradient matmuls nothing needs); shares against delays
injected with ``time.sleep``.
"""

from __future__ import annotations

import collections
import itertools
import time
from typing import Any

import pytest
import torch
from otel_helpers import providers, step_spans, value

import otel_train
from otel_train import contract as c
from otel_train.processing.peaks import PEAKS, lookup_peak
from otel_train.testing import InMemoryTelemetry


def _mlp_flops(batch: int, sizes: tuple[int, ...]) -> int:
    """Linear layers: forward 2BNK each; backward 2BNK for the weight gradient of every
    layer and 2BNK for the input gradient of every layer but the first (x needs none)."""
    total = 0
    for i, (k, n) in enumerate(itertools.pairwise(sizes)):
        total += 2 * batch * k * n * (2 if i == 0 else 3)
    return total


def _gpt2_flops(batch: int, t: int, d: int, layers: int, vocab: int) -> int:
    per_layer = 2 * t * d * 3 * d + 2 * t * d * d + 2 * 2 * t * d * 4 * d + 2 * 2 * t * t * d
    forward = batch * (layers * per_layer + 2 * t * d * vocab)
    return 3 * forward


def _mlp(sizes: tuple[int, ...]) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for k, n in itertools.pairwise(sizes):
        layers += [torch.nn.Linear(k, n), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _loader(n: int, batch: int, width: int, out: int, **kw: Any) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(n, width, generator=g),
                                        torch.randn(n, out, generator=g))  # fmt: skip
    return torch.utils.data.DataLoader(ds, batch_size=batch, **kw)


def _train(model: torch.nn.Module, opt: Any, loader: Any, epochs: int = 1) -> None:
    for _ in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


def _global_module_hooks() -> tuple[int, ...]:
    m = torch.nn.modules.module
    return tuple(len(getattr(m, name)) for name in dir(m) if name.startswith("_global_")
                 and name.endswith("hooks"))  # fmt: skip


def _attrs(tel: InMemoryTelemetry) -> list[dict[str, Any]]:
    return [dict(s.attributes) for s in step_spans(tel.spans())]


def test_counted_flops_of_an_mlp_match_the_analytic_count() -> None:
    sizes = (64, 256, 128, 10)
    model = _mlp(sizes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = _loader(96, 32, 64, 10)
    tel = InMemoryTelemetry()
    hooks_before = _global_module_hooks()
    otel_train.instrument(model, optimizer=opt, dataloader=loader, trace_steps="all",
                          console="off", **providers(tel))  # fmt: skip
    _train(model, opt, loader)
    session = otel_train.session.current()
    assert session is not None
    probe_after = session.recorder.flop_probe
    # Nothing of the counter stays behind: no dispatch mode, no global module hooks.
    assert torch._C._len_torch_dispatch_stack() == 0
    assert _global_module_hooks() == hooks_before
    otel_train.shutdown()
    steps = _attrs(tel)
    expected = _mlp_flops(32, sizes)
    # Counting is at step 1 (step 0 warms up); step 0 has the same shape, so it may get the
    # count too when it resolves after it.
    assert c.STEP_FLOPS_COUNTED.key not in steps[0]
    assert steps[1][c.STEP_FLOPS_COUNTED.key] is True
    for s in steps[1:]:
        assert s[c.STEP_FLOPS.key] == pytest.approx(expected, rel=0.05)
        assert s[c.STEP_FLOPS_SOURCE.key] == "counted"
    assert c.STEP_FLOPS_COUNTED.key not in steps[2]
    assert c.STEP_THROUGHPUT_FLOPS.key not in steps[1]  # the slow counted step has no rate
    rate = steps[2][c.STEP_THROUGHPUT_FLOPS.key]
    assert rate == pytest.approx(expected / steps[2][c.STEP_HOST_DURATION.key])
    # Later steps pay nothing: the recorder holds no probe once the shape was counted.
    assert probe_after is None


def test_counted_flops_of_a_tiny_transformer_match_the_analytic_count() -> None:
    transformers = pytest.importorskip("transformers")
    d, layers, vocab, t, batch = 64, 2, 128, 32, 4
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=d, n_head=4, n_positions=t,
                                  vocab_size=vocab, bos_token_id=0, eos_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, trace_steps="all", console="off",
                          **providers(tel))  # fmt: skip
    for _ in range(3):
        ids = torch.randint(0, vocab, (batch, t))
        with otel_train.step(samples=batch, tokens=batch * t):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    otel_train.shutdown()
    steps = _attrs(tel)
    assert steps[1][c.STEP_FLOPS_COUNTED.key] is True
    assert steps[2][c.STEP_FLOPS.key] == pytest.approx(
        _gpt2_flops(batch, t, d, layers, vocab), rel=0.05
    )


def _shapes_run(
    batches: list[int], step_s: float, quiet: tuple[int, ...] = ()
) -> tuple[list[dict[str, Any]], Any, Any]:
    """Explicit steps of an MLP, one batch size each, each resolved before the next;
    ``step_s``: time each step but those of index in ``quiet`` also sleeps. Returns
    (step spans' attributes, the probe armed at the end, the efficiency tracker)."""
    sizes = (16, 32, 4)
    model = _mlp(sizes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, trace_steps="all", console="off",
                          sidecar="off", **providers(tel))  # fmt: skip
    session = otel_train.session.current()
    assert session is not None
    for index, batch in enumerate(batches):
        x = torch.randn(batch, 16)
        with otel_train.step(samples=batch):
            model(x).sum().backward()
            opt.step()
            if index not in quiet:
                time.sleep(step_s)
        deadline = time.monotonic() + 10  # the worker resolves each step before the next
        while session.worker.steps_processed <= index and time.monotonic() < deadline:
            time.sleep(0.005)
    probe_after = session.recorder.flop_probe
    otel_train.shutdown()
    return _attrs(tel), probe_after, session.efficiency


def _sources(steps: list[dict[str, Any]]) -> list[str]:
    return [s[c.STEP_FLOPS_SOURCE.key] if c.STEP_FLOPS.key in s else "" for s in steps]


def test_a_new_batch_shape_is_counted_again_and_scaled_until_then() -> None:
    sizes = (16, 32, 4)
    # The recount must fit the 5% budget: the counted steps' time against every step's.
    # Steps sleep 60 ms but the first counted one (its count alone, then): a count may
    # take ~110 ms on a busy host.
    steps, probe_after, _ = _shapes_run([8] * 40 + [4, 4, 4], step_s=0.06, quiet=(1,))
    counted_at = [i for i, s in enumerate(steps) if s.get(c.STEP_FLOPS_COUNTED.key)]
    assert _sources(steps) == ["", *["counted"] * 39, "scaled", "counted", "counted"]
    assert counted_at == [1, 41]  # the first step of the new shape armed the recount
    assert steps[40][c.STEP_FLOPS.key] == pytest.approx(_mlp_flops(8, sizes) / 2)
    assert steps[41][c.STEP_FLOPS.key] == pytest.approx(_mlp_flops(4, sizes), rel=0.05)
    assert steps[2][c.STEP_FLOPS.key] == pytest.approx(_mlp_flops(8, sizes), rel=0.05)
    assert probe_after is None


def test_a_short_run_is_not_made_of_counts() -> None:
    """Issue 13 item 6: counted steps stay within 5% of the step time seen; past that a
    new shape is scaled from the nearest counted one, and the summary says how many."""
    steps, probe_after, tracker = _shapes_run([8, 8, 8, 4, 4, 4], step_s=0.0)
    assert _sources(steps) == ["", "counted", "counted", "scaled", "scaled", "scaled"]
    assert [i for i, s in enumerate(steps) if s.get(c.STEP_FLOPS_COUNTED.key)] == [1]
    assert probe_after is None
    assert tracker.counted_total == 1 and tracker.scaled_steps == 3


def test_mfu_from_a_given_peak_is_the_hand_arithmetic() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(flops_per_step=3.0e9, peak_tflops=0.25, trace_steps="all",
                         console="off", **providers(tel))  # fmt: skip
    for _ in range(4):
        with otel_train.step(samples=1):
            time.sleep(0.01)
    otel_train.shutdown()
    steps = _attrs(tel)
    total_s = 0.0
    for s in steps:
        host_s = s[c.STEP_HOST_DURATION.key]
        total_s += host_s
        assert s[c.STEP_FLOPS_SOURCE.key] == "given"
        assert s[c.STEP_THROUGHPUT_FLOPS.key] == pytest.approx(3.0e9 / host_s)
        assert s[c.STEP_MFU.key] == pytest.approx(3.0e9 / host_s / 0.25e12)
    # No model was given, so the precision is unknown: the MFU point has no dtype (the
    # peak is the one given).
    mfu = value(tel, c.MFU.name)
    assert mfu == pytest.approx(4 * 3.0e9 / total_s / 0.25e12)
    # The peak is not a series of its own: achieved FLOP/s over MFU gives it back.
    assert value(tel, c.THROUGHPUT_FLOPS.name) / mfu == pytest.approx(0.25e12)


def test_mfu_is_absent_on_cpu_without_a_peak_and_the_estimate_is_six_n_t() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50))
    n_params = sum(p.numel() for p in model.parameters())
    tel = InMemoryTelemetry()
    otel_train.instrument(model, flops="estimate", trace_steps="all", console="off",
                          **providers(tel))  # fmt: skip
    with otel_train.step(samples=2, tokens=24):
        model(torch.randint(0, 50, (2, 12))).sum().backward()
    otel_train.shutdown()
    (step,) = _attrs(tel)
    assert step[c.STEP_FLOPS.key] == 6 * n_params * 24
    assert step[c.STEP_FLOPS_SOURCE.key] == "estimate"
    assert c.STEP_THROUGHPUT_FLOPS.key in step
    if not torch.cuda.is_available():
        assert c.STEP_MFU.key not in step
        assert c.MFU.name not in tel.metrics()


class _SlowDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, delay_s: float) -> None:
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_s)
        return torch.ones(4), torch.zeros(1)


class _SlowModel(torch.nn.Module):
    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        return self.lin(x)


def test_stall_share_of_a_slowed_loader_is_the_injected_share() -> None:
    data_s, compute_s = 0.03, 0.07  # injected: 30% of each step waits for the batch
    model = _SlowModel(compute_s)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(_SlowDataset(8, data_s), batch_size=1)
    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, dataloader=loader, trace_steps="all",
                          console="off", flops="off", **providers(tel))  # fmt: skip
    # The truth is the loop's own clock: how long it waited in next() against the whole
    # iteration, as really elapsed. On a loaded machine the sleeps stretch and the loader's
    # own work around them takes longer; both land in the wait the loop saw.
    waited: list[float] = []
    iteration: list[float] = []
    batches = iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            x, y = next(batches)
        except StopIteration:
            break
        t1 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t2 = time.perf_counter()
        waited.append(t1 - t0)
        iteration.append(t2 - t0)
    otel_train.shutdown()
    injected = [w / i for w, i in zip(waited, iteration, strict=True)]
    assert all(w >= data_s for w in waited)  # the delay was really injected
    shares = [s[c.STEP_DATA_STALL.key] for s in _attrs(tel)]
    assert len(shares) == len(injected) == 8
    for share, want in zip(shares[1:], injected[1:], strict=True):  # step 0: loader start-up
        assert share == pytest.approx(want, abs=0.05)
    # The run's stall share, as Prometheus derives it from the run-time counters.
    run_time = {p.attributes[c.A_CATEGORY]: p.value for p in tel.points(c.RUN_TIME.name)}
    stall = run_time["data"] / (run_time["train"] + run_time["data"])
    assert stall == pytest.approx(sum(waited) / sum(iteration), abs=0.05)


def test_goodput_of_a_run_with_an_injected_pause_and_an_evaluation() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", flops="off", sidecar="off", **providers(tel))
    step_s, pause_s, eval_s = 0.02, 0.3, 0.15

    def steps(n: int) -> None:
        for _ in range(n):
            with otel_train.step(samples=1):
                time.sleep(step_s)

    # The injected times as they really elapsed (a loaded machine oversleeps).
    t0 = time.perf_counter()
    steps(10)
    t1 = time.perf_counter()
    time.sleep(pause_s)  # outside any step: "other"
    t2 = time.perf_counter()
    with otel_train.region("evaluation"):
        time.sleep(eval_s)
    t3 = time.perf_counter()
    steps(10)
    wall = time.perf_counter() - t0
    pause_s, eval_s = t2 - t1, t3 - t2
    session = otel_train.session.current()
    assert session is not None
    otel_train.shutdown()
    tracker = session.efficiency
    shares = tracker.goodput_shares()
    assert shares is not None
    measured_wall, share = shares
    assert measured_wall == pytest.approx(wall, abs=0.02)
    expected_train = 1.0 - (pause_s + eval_s) / wall
    assert share["train"] == pytest.approx(expected_train, abs=0.05)
    assert share["evaluation"] == pytest.approx(eval_s / wall, abs=0.05)
    assert share["other"] == pytest.approx(pause_s / wall, abs=0.05)
    run_time = {p.attributes[c.A_CATEGORY]: p.value for p in tel.points(c.RUN_TIME.name)}
    assert run_time["train"] / sum(run_time.values()) == pytest.approx(share["train"])
    assert run_time["evaluation"] == pytest.approx(eval_s, abs=0.03)
    assert "checkpoint" not in run_time  # a category's series starts with its first second
    assert sum(share.values()) == pytest.approx(1.0, abs=1e-6)


def test_region_kind_is_checked() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", **providers(tel))
    with pytest.raises(ValueError, match="evaluation, checkpoint"):
        otel_train.region("eval")
    otel_train.shutdown()


@pytest.mark.parametrize(
    ("name", "dtype", "label", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "bf16", "H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", "fp8", "H100 NVL", 1670.5),
        ("NVIDIA H200", "bf16", "H200 SXM", 989.5),
        ("NVIDIA H200 NVL", "bf16", "H200 NVL", 835.5),
        ("NVIDIA A100-SXM4-80GB", "tf32", "A100", 156.0),
        ("NVIDIA B200", "bf16", "B200", 2250.0),
        ("NVIDIA L40S", "fp16", "L40S", 362.05),
        ("AMD Instinct MI300X", "bf16", "MI300X", 1307.4),
        ("AMD Instinct MI250X/MI250", "tf32", "MI250X GCD", 47.85),  # no TF32: the fp32 rate
    ],
)
def test_peak_table_lookup_by_device_name(name: str, dtype: str, label: str, tflops: float) -> None:
    peak = lookup_peak(name, dtype)
    assert peak is not None
    assert (peak.device, peak.flops_per_s) == (label, pytest.approx(tflops * 1e12))


def test_peak_table_unknown_devices_and_the_override() -> None:
    assert lookup_peak("Some Future GPU", "bf16") is None
    assert lookup_peak(None, "bf16") is None
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "fp8") is None  # Ampere has no FP8
    peak = lookup_peak("NVIDIA H100 80GB HBM3", "bf16", override_tflops=500.0)
    assert peak is not None and peak.flops_per_s == 500e12 and peak.device == "setting"
    assert all(row.source for row in PEAKS)


def test_a_user_exception_in_the_counted_step_passes_through_and_the_counter_ends() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(trace_steps="all", console="off", flops_count_step=0, **providers(tel))
    model = torch.nn.Linear(4, 4)
    with pytest.raises(KeyError, match="user's own"), otel_train.step(samples=2):
        model(torch.ones(2, 4)).sum().backward()
        raise KeyError("user's own")
    assert torch._C._len_torch_dispatch_stack() == 0
    with otel_train.step(samples=2):
        model(torch.ones(2, 4)).sum().backward()
    otel_train.shutdown()
    steps = _attrs(tel)
    assert steps[0][c.STEP_FLOPS_COUNTED.key] is True
    assert steps[1][c.STEP_FLOPS.key] == 2 * (2 * 2 * 4 * 4)  # forward, weight gradient


def test_a_failing_flop_counter_disables_counting_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch.utils.flop_counter as flop_counter

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no counter today")

    monkeypatch.setattr(flop_counter, "FlopCounterMode", broken)
    tel = InMemoryTelemetry()
    otel_train.configure(trace_steps="all", console="off", **providers(tel))
    model = torch.nn.Linear(4, 4)
    for _ in range(4):
        with otel_train.step(samples=2):
            model(torch.ones(2, 4)).sum().backward()
    session = otel_train.session.current()
    assert session is not None
    assert session.recorder.flop_probe is None and session.recorder.enabled
    otel_train.shutdown()
    steps = _attrs(tel)
    assert len(steps) == 4
    assert all(c.STEP_FLOPS.key not in s and c.STEP_DATA_STALL.key in s for s in steps)
    assert sum("counting FLOPs failed" in r.getMessage() for r in caplog.records) == 1


def test_a_shape_within_ten_percent_of_a_counted_one_is_scaled_not_recounted() -> None:
    model = torch.nn.Linear(8, 8)
    tel = InMemoryTelemetry()
    otel_train.configure(trace_steps="all", console="off", sidecar="off", **providers(tel))
    session = otel_train.session.current()
    assert session is not None
    for i, tokens in enumerate([100, 100, 100, 105, 100]):
        with otel_train.step(samples=1, tokens=tokens):
            model(torch.ones(tokens, 8)).sum().backward()
        deadline = time.monotonic() + 10
        while session.worker.steps_processed <= i and time.monotonic() < deadline:
            time.sleep(0.005)
    probe_after = session.recorder.flop_probe
    otel_train.shutdown()
    steps = _attrs(tel)
    assert [s.get(c.STEP_FLOPS_COUNTED.key, False) for s in steps] == [False, True] + [False] * 3
    assert steps[3][c.STEP_FLOPS_SOURCE.key] == "scaled"
    assert steps[3][c.STEP_FLOPS.key] == pytest.approx(steps[2][c.STEP_FLOPS.key] * 1.05)
    assert probe_after is None


@pytest.fixture
def fresh_dynamo() -> Any:
    """Dynamo's caches and counters are process-wide: start and leave them empty."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("order", ["compile-first", "instrument-first"])
def test_a_compiled_model_is_not_counted(
    order: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Counting would run the compiled step under a dispatch mode: Dynamo recompiles and
    warns about the counter's global hooks (an error under this suite's warning filter).
    The summary says why no FLOPs line is there (issue 38 item 16: they vanished)."""
    sizes = (16, 32, 4)
    model = _mlp(sizes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = _loader(96, 16, 16, 4)
    tel = InMemoryTelemetry()
    if order == "compile-first":
        model = torch.compile(model, backend="eager")
    otel_train.instrument(model, optimizer=opt, dataloader=loader, trace_steps="all",
                          console="stderr", console_every=0, **providers(tel))  # fmt: skip
    if order == "instrument-first":
        model = torch.compile(model, backend="eager")
    with caplog.at_level("INFO", logger="otel_train"):
        _train(model, opt, loader)
    session = otel_train.session.current()
    assert session is not None
    assert session.recorder.flop_probe is None
    otel_train.shutdown()
    steps = _attrs(tel)
    assert len(steps) == 6
    assert all(c.STEP_FLOPS.key not in s for s in steps)  # no count: no FLOPs, no MFU
    assert any("not counted" in r.getMessage() for r in caplog.records)
    assert "FLOPs not counted: the model runs under torch.compile" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["shutdown", "internal-error"])
def test_a_count_cut_short_leaves_no_dispatch_mode_behind(how: str) -> None:
    """A dispatch mode left on the training thread would slow every later operator."""
    sizes = (16, 32, 4)
    model = _mlp(sizes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = _loader(64, 16, 16, 4)
    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          **providers(tel))  # fmt: skip
    session = otel_train.session.current()
    assert session is not None
    it = iter(loader)
    for _ in range(2):  # step 0, then the data fetch that opens step 1: counting starts
        x, y = next(it)
        if _ == 0:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert torch._C._len_torch_dispatch_stack() > 0  # the count of step 1 is running
    if how == "internal-error":
        session.recorder._fail()  # what any error inside telemetry does
        model(x).sum().backward()  # training goes on; the next hook ends the count
        assert torch._C._len_torch_dispatch_stack() == 0
    otel_train.shutdown()
    assert torch._C._len_torch_dispatch_stack() == 0


class _CountedOnce:
    """A FLOP probe that has counted step 1 (what the training thread's probe hands on)."""

    def __init__(self, seconds: float) -> None:
        from otel_train.processing.flops import CountResult

        self.results = collections.deque(
            [
                CountResult(
                    index=1,
                    samples=8,
                    tokens=None,
                    padded=None,
                    flops=1_000_000,
                    dtype="fp32",
                    seconds=seconds,
                )
            ]
        )
        self.armed = False
        self.failed = False

    def arm(self, at_index: int = 0) -> None:
        self.armed = True


@pytest.mark.parametrize(("counted_s", "later_s"), [(0.200, 0.050), (0.199, 0.250)])
def test_count_cost_line_never_contradicts_itself(counted_s: float, later_s: float) -> None:
    """The summary gives the counting step's extra time over the typical step it was
    compared with, and says so plainly when the steps after it were slower."""
    from otel_train.processing.blocks import group_steps
    from otel_train.processing.console import fmt_seconds
    from otel_train.processing.efficiency import EfficiencyTracker
    from otel_train.processing.efficiency_lines import summary_lines
    from otel_train.processing.resolved import finished_step
    from otel_train.recording.regions import RegionLog
    from otel_train.settings import Settings

    settings = Settings.resolve({"peak_tflops": 1.0})
    tracker = EfficiencyTracker(settings, None, RegionLog(), 20, probe=_CountedOnce(counted_s))
    t = 0
    for index, seconds in enumerate([0.1, counted_s] + [later_s] * 5):
        step = finished_step(index, t, t + int(seconds * 1e9))
        step.samples = 8
        t += int(seconds * 1e9)
        (block,) = group_steps([step], {})
        tracker.observe(block)
    line = next(x for x in summary_lines(tracker, fmt_seconds) if "counting step took" in x)
    assert "+0.0" not in line and "+0 " not in line
    if counted_s > later_s:
        extra = fmt_seconds(counted_s - later_s)
        assert f"(+{extra} over a typical step of {fmt_seconds(later_s)})" in line
    else:
        assert f"no slower than a typical step ({fmt_seconds(later_s)})" in line
