"""The precision MFU's peak is looked up for, and MFU left out rather than wrong.

Issue 22 items 1, 2 and 10: the new fp32_precision API set by the user, compute the FLOP
counter cannot see, autocast over float32 parameters, convolutions in TF32. The device
name comes from the stand-in CUDA runtime (an H100), so the datasheet table applies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import cuda_standin
import pytest
import torch
from otel_helpers import providers, step_spans, value

import otel_train
from otel_train import contract as c
from otel_train.processing.peaks import lookup_peak
from otel_train.recording import precision
from otel_train.testing import InMemoryTelemetry

H100_BF16, H100_FP32, H100_TF32 = 989.4e12, 66.9e12, 494.7e12


@pytest.fixture
def new_precision_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``torch.backends.fp32_precision = "tf32"``, PyTorch's recommended API, restored after."""
    before = torch.backends.fp32_precision
    torch.backends.fp32_precision = "tf32"
    yield
    torch.backends.fp32_precision = before


def _loop(model: torch.nn.Module, steps: int = 4, width: int = 8, autocast: bool = False) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(torch.randn(4 * steps, width), batch_size=4)
    otel_train.instrument(model, optimizer=opt, dataloader=data)
    for x in data:
        if autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().sum()
        else:
            loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()


def _summary(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err


def test_the_new_precision_api_does_not_crash_the_counted_step(
    new_precision_api: None,
) -> None:
    """Item 1: the matmul-precision getter raises once the new API is set; it ran inside
    the FLOP counter's dispatch mode, so the user's own matmul raised in step 1."""
    tel = InMemoryTelemetry()
    otel_train.configure(trace_steps="all", console="off", **providers(tel))
    _loop(torch.nn.Linear(8, 8))
    otel_train.shutdown()
    steps = [dict(s.attributes) for s in step_spans(tel.spans())]
    assert len(steps) == 4
    counted = [s for s in steps if s.get(c.STEP_FLOPS_COUNTED.key)]
    assert len(counted) == 1 and counted[0][c.STEP_FLOPS.key] > 0
    assert precision.fp32_label() == "tf32"  # read the new way, after the step


def test_compute_the_counter_cannot_see_gives_no_mfu_and_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Item 2: zero counted FLOPs are unknown FLOPs, not an MFU of 0%."""

    class Elementwise(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * self.w).tanh()

    tel = InMemoryTelemetry()
    otel_train.configure(
        trace_steps="all", peak_tflops=1.0, console="stderr", console_every=0, **providers(tel)
    )
    _loop(Elementwise(), steps=6)
    otel_train.shutdown()
    text = _summary(capsys)
    assert "MFU 0.0%" not in text and "0 TFLOP/s" not in text
    assert "none the counter can see" in text and "flops_per_step" in text
    assert value(tel, c.MFU.name, dtype="fp32") is None
    assert all(c.STEP_MFU.key not in s.attributes for s in step_spans(tel.spans()))


def _mfu_dtype(tel: InMemoryTelemetry) -> tuple[str, float] | None:
    points = tel.points(c.MFU.name)
    if not points:
        return None
    (point,) = points
    return point.attributes[c.A_DTYPE], float(point.value)


@pytest.fixture
def h100(monkeypatch: pytest.MonkeyPatch) -> Iterator[cuda_standin.Runtime]:
    with cuda_standin.installed(monkeypatch) as rt:
        yield rt


def test_autocast_over_float32_parameters_takes_the_bf16_peak(h100: Any) -> None:
    """Item 10: given FLOPs (nothing counted): the dtype was the parameters' (fp32), so
    MFU was measured against the fp32 peak, ~15x too high on an H100."""
    tel = InMemoryTelemetry()
    otel_train.configure(flops_per_step=1e9, console="off", **providers(tel))
    _loop(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)), autocast=True)
    otel_train.flush()
    achieved = value(tel, c.THROUGHPUT_FLOPS.name)
    otel_train.shutdown()
    got = _mfu_dtype(tel)
    assert got is not None and achieved is not None
    assert got[0] == "bf16"
    assert got[1] == pytest.approx(achieved / H100_BF16)


def _conv_loop(model: torch.nn.Module) -> None:
    """Four steps of a 1-d convolutional model, then shutdown."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(torch.randn(16, 1, 8), batch_size=4)
    otel_train.instrument(model, optimizer=opt, dataloader=data)
    for x in data:
        model(x).sum().backward()
        opt.step()
    otel_train.shutdown()


def test_float32_convolutions_take_cudnns_tf32_peak(h100: Any) -> None:
    """Item 10: cuDNN runs float32 convolutions in TF32 by default (matmuls are 'highest')."""
    tel = InMemoryTelemetry()
    otel_train.configure(flops_per_step=1e9, console="off", **providers(tel))
    _conv_loop(torch.nn.Sequential(torch.nn.Conv1d(1, 2, 3), torch.nn.Flatten()))
    got = _mfu_dtype(tel)
    assert got is not None and got[0] == "tf32"


def test_convolutions_and_matmuls_at_different_precisions_give_no_mfu(
    h100: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 10: unsure is no MFU, with the reason in the summary."""
    tel = InMemoryTelemetry()
    otel_train.configure(flops_per_step=1e9, console="stderr", console_every=0, **providers(tel))
    _conv_loop(
        torch.nn.Sequential(torch.nn.Conv1d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(12, 2))
    )
    assert _mfu_dtype(tel) is None
    assert "precision the matmuls ran in is unknown" in _summary(capsys)


def test_counted_matmuls_under_the_new_api_take_the_tf32_peak(
    h100: Any, new_precision_api: None
) -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", **providers(tel))
    _loop(torch.nn.Linear(8, 8), steps=6)
    otel_train.shutdown()
    got = _mfu_dtype(tel)
    assert got is not None and got[0] == "tf32"


@pytest.mark.parametrize(
    ("name", "dtype", "label", "tflops"),
    [
        ("NVIDIA GH200 480GB", "bf16", "GH200", 989.5),  # matched the H200 row before
        ("NVIDIA H800 PCIe", "bf16", "H800 PCIe", 756.0),  # got the SXM peak before
        ("NVIDIA H800", "bf16", "H800 SXM", 989.4),
        ("AMD Instinct MI250", "bf16", "MI250 GCD", 181.0),  # got MI250X values before
        ("AMD Instinct MI300X", "tf32", "MI300X", 163.4),  # no HIPBLASLT_ALLOW_TF32: fp32
    ],
)
def test_peak_table_rows_found_wrong_by_the_review(
    name: str, dtype: str, label: str, tflops: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HIPBLASLT_ALLOW_TF32", raising=False)
    peak = lookup_peak(name, dtype)
    assert peak is not None
    assert (peak.device, peak.flops_per_s) == (label, pytest.approx(tflops * 1e12))


def test_rocm_tf32_when_hipblaslt_allows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIPBLASLT_ALLOW_TF32", "1")
    peak = lookup_peak("AMD Instinct MI300X", "tf32")
    assert peak is not None and peak.flops_per_s == pytest.approx(653.7e12)


@pytest.fixture
def cuda_tf32_allowed() -> Iterator[None]:
    """nanoGPT's ``torch.backends.cuda.matmul.allow_tf32 = True``, restored after."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def test_a_cpu_run_is_not_labelled_by_cudas_tf32_setting(
    cuda_tf32_allowed: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 38 item 16: CUDA's TF32 switch labelled CPU matmuls "tf32"; on the CPU,
    oneDNN's setting applies (unset here: float32)."""
    assert precision.fp32_label() == "tf32"  # (CUDA's own label follows the switch)
    otel_train.configure(console="stderr", console_every=0, **providers(InMemoryTelemetry()))
    _loop(torch.nn.Linear(8, 8))
    otel_train.shutdown()
    text = _summary(capsys)
    assert "matmuls in fp32" in text and "tf32" not in text
    assert precision.model_label([torch.nn.Linear(8, 8)], None, cpu=True) == "fp32"


def test_given_flops_with_no_model_known_give_no_mfu_and_say_why(
    h100: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 38 item 13: with no model the label was "fp32", so bf16 work got an MFU
    measured against the fp32 peak (~15x high on an H100). Unsure is no MFU."""
    tel = InMemoryTelemetry()
    otel_train.configure(flops_per_step=1e9, console="stderr", console_every=0, **providers(tel))
    w = torch.randn(8, 8, dtype=torch.bfloat16)
    for _ in range(4):
        with otel_train.step(samples=8):
            (w @ w).sum()
    otel_train.shutdown()
    assert value(tel, c.THROUGHPUT_FLOPS.name) is not None
    assert _mfu_dtype(tel) is None
    text = _summary(capsys)
    assert "MFU -" in text and "no model given to instrument()" in text
