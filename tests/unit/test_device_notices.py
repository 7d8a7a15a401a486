"""Issue 38 item 16, on the CUDA stand-in and a gloo group: the per-phase peak reset is
said once at start with the setting that turns it off; a MIG slice gets no whole-GPU peak
(no MFU, said why); the Flight Recorder dump honours its older variable's name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cuda_standin
import pytest
import torch
from otel_helpers import providers, single_rank_group

import otel_train
from otel_train import contract as c
from otel_train.processing.hang_details import flight_recorder
from otel_train.testing import InMemoryTelemetry

MiB = 1 << 20


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[cuda_standin.Runtime]:
    with cuda_standin.installed(monkeypatch) as runtime:
        yield runtime


def _cuda_steps(rt: cuda_standin.Runtime, **settings: object) -> InMemoryTelemetry:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", **settings, **providers(tel))
    for _ in range(3):
        with otel_train.step(samples=1), otel_train.phase("forward"):
            rt.alloc(MiB)
            rt.free(MiB)
    otel_train.shutdown()
    return tel


def _notices(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "reset_peak_memory=False" in r.getMessage()]


def test_the_peak_reset_is_said_once_naming_the_setting(
    rt: cuda_standin.Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """A user's own max_memory_allocated() logging (torchtitan's memory monitor) read
    per-phase peaks without a word."""
    with caplog.at_level("WARNING", logger="otel_train"):
        _cuda_steps(rt)
    (notice,) = _notices(caplog)
    assert "max_memory_allocated()" in notice and "OTEL_TRAIN_RESET_PEAK_MEMORY=0" in notice
    assert rt.resets[0] > 0  # (and the peaks are reset, as said)


def test_no_notice_when_the_user_keeps_the_peaks(
    rt: cuda_standin.Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="otel_train"):
        _cuda_steps(rt, reset_peak_memory=False)
    assert _notices(caplog) == []
    assert rt.resets[0] == 0


def test_a_mig_slice_gets_no_whole_gpu_peak(
    rt: cuda_standin.Runtime, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 1g slice has about a seventh of the GPU's compute: the H100 row's peak made its
    MFU ~7x low."""
    name = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    tel = InMemoryTelemetry()
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    otel_train.instrument(model, optimizer=opt, flops_per_step=1e9, console="stderr",
                          console_every=0, **providers(tel))  # fmt: skip
    for _ in range(4):
        model(torch.ones(2, 8)).sum().backward()
        opt.step()
    otel_train.shutdown()
    assert tel.points(c.MFU.name) == []
    text = capsys.readouterr().err
    assert f"MFU - ({name} is a MIG slice" in text and "peak_tflops" in text


@pytest.mark.parametrize(
    ("fr", "nccl", "dumped"),
    [("", "100", True), ("0", "100", False), ("", "0", False), ("", "", False)],
)
def test_the_flight_recorder_dump_honours_both_buffer_size_names(
    fr: str, nccl: str, dumped: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch reads TORCH_FR_BUFFER_SIZE, then the older TORCH_NCCL_TRACE_BUFFER_SIZE: the
    first one set wins. The dump looked at the first only."""
    for variable, value in (("TORCH_FR_BUFFER_SIZE", fr), ("TORCH_NCCL_TRACE_BUFFER_SIZE", nccl)):
        if value:
            monkeypatch.setenv(variable, value)
        else:
            monkeypatch.delenv(variable, raising=False)
    with single_rank_group():
        path = flight_recorder(str(tmp_path))
    assert (path is not None) == dumped
    if dumped:
        assert path is not None and Path(path).stat().st_size > 0
