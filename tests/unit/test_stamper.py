"""The boundary stamp in C (recording/_stamp.c) takes what the Python one takes
(stamps.BoundaryStamps.take_stamp): the same CUDA calls, the same sample, the same
device check, no event during a CUDA-graph capture; and an error in a call reaches the
hook (which logs it once and turns recording off), never a half-taken stamp.

Against the stand-in runtime (tests/unit/cuda_standin.py)."""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from typing import Any

import cuda_standin
import pytest
import torch

from otel_train.recording import capture
from otel_train.recording.recorder import Recorder
from otel_train.recording.stamps import UNSTAMPED, NativeStamper, PythonStampedDeque, StampedLog
from otel_train.settings import Settings


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[cuda_standin.Runtime]:
    """The stand-in runtime; skips where _stamp.c was not built, unless
    OTEL_TRAIN_NATIVE_REQUIRED=1 (CI, which installs the package) makes that a failure."""
    if NativeStamper is None:
        if os.environ.get("OTEL_TRAIN_NATIVE_REQUIRED") == "1":
            pytest.fail("otel_train.recording._stamp was not built (setup.py)")
        pytest.skip("the C stamper was not built")
    with cuda_standin.installed(monkeypatch) as runtime:
        yield runtime


def _recorder(**settings: Any) -> Recorder:
    rec = Recorder(Settings.resolve({"console": "off", **settings}))
    rec.bind_device(0)
    rec.bind_for_scalars()
    from otel_train.recording.memory import CudaMemoryTracker

    if rec.settings.memory:
        rec.memory = CudaMemoryTracker(rec.settings.reset_peak_memory, device=0)
    return rec


def _take_both(rt: cuda_standin.Runtime, rec: Recorder) -> tuple[Any, Any]:
    """A stamp each way, after the same allocations; each sample must be the peak then."""
    native = rec.stamper()
    assert isinstance(native, NativeStamper)
    stamps = []
    for take in (rec.take_stamp, native):
        rt.alloc(3 << 20)
        rt.free(3 << 20)
        peak = rt.peak[0]
        stamp = take()
        assert stamp[1] == (peak, peak, 0, 0)
        stamps.append(stamp)
    return stamps[0], stamps[1]


def test_the_c_stamp_is_the_python_stamp(rt: cuda_standin.Runtime) -> None:
    rec = _recorder()
    resets = rt.resets[0]
    python, native = _take_both(rt, rec)
    assert rt.resets[0] - resets == 2  # one peak reset each
    for stamp in (python, native):
        ev, _, on = stamp
        assert isinstance(ev, cuda_standin.Event) and ev.records == 1 and ev.device == 0
        assert on is True
    assert rec.stamps_taken() == 2
    # The pool's events go round: a released one is the next one recorded.
    rec.events.release(native[0])
    again = rec.stamper()()
    assert again[0] is native[0] and native[0].records == 2


def test_memory_off_and_resets_off(rt: cuda_standin.Runtime) -> None:
    rec = _recorder(memory=False)
    assert rec.stamper()()[1] is None and rec.take_stamp()[1] is None
    rec = _recorder(reset_peak_memory=False)
    resets = rt.resets[0]
    python, native = _take_both(rt, rec)
    assert rt.resets[0] == resets, "a peak reset with reset_peak_memory off"
    assert native[1] == python[1], "no reset between them: the same peak"


def test_another_device_and_a_capture(
    rt: cuda_standin.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = _recorder()
    stamper = rec.stamper()
    torch.cuda.set_device(1)
    ev, _, on = stamper()
    assert on is False and rec.take_stamp()[2] is False
    assert ev.device == 0, "the event goes on the bound device's stream"
    torch.cuda.set_device(0)
    monkeypatch.setattr(capture, "active", 1)
    assert stamper()[0] is None and rec.take_stamp()[0] is None


def test_an_error_in_a_call_reaches_the_caller(
    rt: cuda_standin.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(device: int) -> dict[str, Any]:
        raise RuntimeError("allocator statistics unavailable")

    monkeypatch.setattr(torch._C, "_cuda_memoryStats", broken)  # (torch's call)
    rec = _recorder()
    free = len(rec.events.free)
    with pytest.raises(RuntimeError, match="allocator statistics"):
        rec.stamper()()
    assert rec.stamps_taken() == 0 and len(rec.events.free) == free


def test_the_c_stamped_append_is_the_python_one(rt: cuda_standin.Runtime) -> None:
    """StampedLog's append (C) against stamps.PythonStampedDeque's: a stamp for an entry
    with a time, None for one at time 0; an entry that is not a tuple is refused."""

    class Reference(PythonStampedDeque):
        def __init__(self) -> None:
            super().__init__()
            self.take_stamp = iter(range(100)).__next__

    native = StampedLog(iter(range(100)).__next__, collections.deque([("s", 5, 1), ("s", 0)]))
    ref = Reference()
    entries = [("s", 7, 2, "name"), ("s", 0, 3), ("s", 9, 4, None)]
    for entry in entries:
        native.append(entry)
        ref.append(entry)
    assert list(ref) == [("s", 7, 2, "name", 0), ("s", 0, 3, None), ("s", 9, 4, None, 1)]
    # (entries logged before stamps began: host time, or no stamp at time 0)
    assert list(native) == [("s", 5, 1, UNSTAMPED), ("s", 0, None), *ref]
    with pytest.raises(TypeError):
        native.append(["s", 1])
