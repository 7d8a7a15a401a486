"""A stand-in CUDA runtime, so that otel-train's CUDA paths run on a machine without a GPU.

It replaces the parts of ``torch.cuda`` the recording core calls (events, streams, the
current device, allocator statistics, graph capture) with small models of what the real
runtime does, including the behaviour the GPU review found the core tripping on:

- ``Event.query()`` has no device guard: it runs on the calling thread's current device,
  and a call on a device makes a context there (:attr:`Runtime.contexts`, per thread in
  :attr:`Runtime.touched`); ``elapsed_time`` guards its event's device.
- An event records on one device only: recording it on another device's stream raises, as
  ``cudaEventRecord`` does ("Event device 0 does not match recording stream's device 1").
- ``elapsed_time`` raises unless both events completed; events complete when the test says
  (:meth:`Runtime.complete`) or at once (``auto_complete``).
- A capture in the "global" mode (:class:`StandInGraph`) fails on a query from any other
  thread while it is live (:attr:`Runtime.broken_captures`), and an event recorded into a
  capture raises when queried later, as cudaErrorCapturedEvent does.
- ``torch.cuda.synchronize()`` raises: nothing in otel-train may call it; an event cannot
  be pickled.

Device time is the host's ``perf_counter_ns`` plus :attr:`Runtime.lag_ns`, taken when an
event is recorded. Use through the ``standin_cuda`` fixture (tests/unit/conftest.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

GiB = 1 << 30


class Runtime:
    def __init__(self, devices: int = 2) -> None:
        self.devices = devices
        self._tls = threading.local()
        self.contexts: set[int] = set()
        self.touched: dict[str, set[int]] = {}  # thread name -> devices it made calls on
        self.auto_complete = True
        self.lag_ns = 0
        self.events: list[Event] = []
        self.capturing: threading.Thread | None = None
        self.broken_captures = 0
        self.queries = 0
        self.allocated = dict.fromkeys(range(devices), 0)
        self.peak = dict.fromkeys(range(devices), 0)
        self.resets: dict[int, int] = dict.fromkeys(range(devices), 0)

    # -- devices and contexts --------------------------------------------------------

    def current(self) -> int:
        return getattr(self._tls, "device", 0)

    def set_current(self, device: int) -> None:
        self._tls.device = device

    def touch(self, device: int) -> None:
        self.contexts.add(device)
        self.touched.setdefault(threading.current_thread().name, set()).add(device)

    def _unsafe_call(self) -> None:
        """A call the "global" capture mode forbids on other threads while it is live."""
        capturing = self.capturing
        if capturing is not None and threading.current_thread() is not capturing:
            self.broken_captures += 1
            raise RuntimeError("operation not permitted when stream is capturing")

    # -- the test's controls ---------------------------------------------------------

    def complete(self) -> None:
        """Every event recorded so far completes."""
        for ev in self.events:
            if ev.t is not None:
                ev.done = True

    def alloc(self, nbytes: int, device: int = 0) -> None:
        self.allocated[device] += nbytes
        self.peak[device] = max(self.peak[device], self.allocated[device])

    def free(self, nbytes: int, device: int = 0) -> None:
        self.allocated[device] -= nbytes

    # -- what torch.cuda's replaced functions do -------------------------------------

    def memory_stats(self, device: int) -> dict[str, Any]:
        self.touch(device)
        peak = {"all": {"peak": self.peak[device], "current": self.allocated[device]}}
        return {"allocated_bytes": peak, "reserved_bytes": peak, "num_alloc_retries": 0,
                "num_ooms": 0}  # fmt: skip

    def reset_peak(self, device: int) -> None:
        self.resets[device] += 1
        self.peak[device] = self.allocated[device]


RUNTIME: Runtime | None = None


def _rt() -> Runtime:
    assert RUNTIME is not None, "the stand-in CUDA runtime is not installed"
    return RUNTIME


class Stream(SimpleNamespace):
    device: int


class Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.device: int | None = None
        self.t: int | None = None
        self.done = False
        self.captured = False
        self.records = 0
        _rt().events.append(self)

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle 'Event' object")  # (as torch.cuda.Event)

    def record(self, stream: Any = None) -> None:
        rt = _rt()
        device = stream.device if stream is not None else rt.current()
        if self.device is not None and device != self.device:
            raise RuntimeError(
                f"Event device {self.device} does not match recording stream's device {device}"
            )
        self.device = device
        rt.touch(device)  # (recording guards the stream's device)
        self.captured = rt.capturing is threading.current_thread()
        self.t = time.perf_counter_ns() + rt.lag_ns
        self.done = rt.auto_complete and not self.captured
        self.records += 1

    def query(self) -> bool:
        rt = _rt()
        rt._unsafe_call()
        rt.touch(rt.current())  # no device guard: the calling thread's current device
        rt.queries += 1
        if self.captured:
            raise RuntimeError("CUDA error: operation not permitted on an event last recorded "
                               "in a capturing stream")  # fmt: skip
        return self.done

    def elapsed_time(self, end: Event) -> float:
        rt = _rt()
        rt._unsafe_call()
        assert self.device is not None
        rt.touch(self.device)
        if not (self.done and end.done) or self.t is None or end.t is None:
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        if self.device != end.device:
            raise RuntimeError("Both events must be recorded on the same device")
        return (end.t - self.t) / 1e6


class StandInGraph:
    """``torch.cuda.CUDAGraph``: a capture in the "global" mode on the calling thread."""

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        rt = _rt()
        rt._unsafe_call()
        rt.capturing = threading.current_thread() if capture_error_mode == "global" else None

    def capture_end_pre(self) -> None:
        _rt().capturing = None

    def capture_end(self) -> None:
        self.capture_end_pre()


class _Device:
    """``torch.cuda.device``: restores the previous device only where it has a context."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.prev = 0

    def __enter__(self) -> None:
        rt = _rt()
        self.prev = rt.current()
        rt.set_current(self.index)

    def __exit__(self, *exc: object) -> None:
        rt = _rt()
        if self.prev in rt.contexts:
            rt.set_current(self.prev)


def _set_device(index: int) -> None:
    rt = _rt()
    rt.set_current(index)
    rt.touch(index)  # (CUDA 12: cudaSetDevice makes the primary context)


def _synchronize(*args: Any) -> None:
    raise AssertionError("torch.cuda.synchronize() was called")


class CudaLike(torch.Tensor):
    """A CPU tensor that says it lives on CUDA (what raw_scalar copies without a sync)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def cuda_scalar(value: float) -> torch.Tensor:
    return torch.tensor(value).as_subclass(CudaLike)


def pinned_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinned host memory needs a driver: an ordinary tensor stands in for it."""
    empty = torch.empty

    def empty_unpinned(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty_unpinned)


@contextlib.contextmanager
def installed(monkeypatch: pytest.MonkeyPatch, devices: int = 2) -> Iterator[Runtime]:
    """Install the stand-in runtime into ``torch.cuda`` for the test's duration."""
    global RUNTIME
    from otel_train.recording import capture

    rt = RUNTIME = Runtime(devices)
    cuda = torch.cuda
    props = SimpleNamespace(total_memory=80 * GiB, name="NVIDIA H100 80GB HBM3")
    for name, value in {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "device_count": lambda: devices,
        "current_device": rt.current,
        "set_device": _set_device,
        "device": _Device,
        "Event": Event,
        "current_stream": lambda device=None: Stream(
            device=rt.current() if device is None else device
        ),
        "get_device_properties": lambda device=None: props,
        "get_device_name": lambda device=None: props.name,
        "memory_allocated": lambda device=None: rt.allocated[device or 0],
        "memory_reserved": lambda device=None: rt.allocated[device or 0],
        "synchronize": _synchronize,
    }.items():
        monkeypatch.setattr(cuda, name, value)
    monkeypatch.setattr(torch._C, "_cuda_memoryStats", rt.memory_stats, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_resetPeakMemoryStats", rt.reset_peak, raising=False)
    monkeypatch.setattr(torch.cuda.graphs, "CUDAGraph", StandInGraph)
    monkeypatch.setattr(capture, "_installed", False)
    monkeypatch.setattr(capture, "active", 0)
    try:
        yield rt
    finally:
        RUNTIME = None
