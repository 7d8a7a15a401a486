"""Per-phase CUDA allocator peaks: the single owner of peak-statistic resets.

At every phase boundary (enter or exit) the tracker reads the allocator's peak since
the last reset, hands it to every phase open at that moment, and resets the peak.
A phase's peak is therefore the maximum over the segments it spans, which stays
correct under nesting (a parent sees its children's peaks, a child never sees its
parent's earlier peak).

Interaction with your own ``torch.cuda.reset_peak_memory_stats()``: with resets on
(the default) otel-train resets at every phase boundary, so a peak you read yourself
covers only the time since the last boundary. Turn resets off with
``reset_peak_memory=False``: otel-train then never resets, your readings are
undisturbed, and each phase's peak becomes the peak since the last reset anyone made
(an upper bound of the phase's true peak).

All reads are host-side allocator bookkeeping: no device synchronisation.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

_log = logging.getLogger("otel_train")
RESET_NOTICE = (
    "otel-train: CUDA peak memory statistics are reset at every phase boundary (exact "
    "per-phase peaks), so torch.cuda.max_memory_allocated() read by your own code covers "
    "only the time since the last boundary; set reset_peak_memory=False "
    "(OTEL_TRAIN_RESET_PEAK_MEMORY=0) to leave them to you"
)

MemorySample = tuple[int, int, int, int]  # peak allocated, peak reserved, retries, ooms


class CudaMemoryTracker:
    """Allocator figures of one device: the recorder's (device.py), whatever the calling
    thread's current device is."""

    __slots__ = ("_raw", "_reset", "device", "device_id", "reset_peaks", "total_bytes")

    def __init__(self, reset_peaks: bool, device: int | None = None) -> None:
        self.reset_peaks = reset_peaks
        if reset_peaks:
            _log.warning(RESET_NOTICE)  # (once a session: its recorder makes one tracker)
        index = torch.cuda.current_device() if device is None else device
        self.device = index
        props = torch.cuda.get_device_properties(index)
        self.total_bytes = int(props.total_memory)
        self.device_id = device_id(props, index)
        # The nested stats dict avoids memory_stats()'s Python flattening on the hot path.
        self._raw: Any = getattr(torch._C, "_cuda_memoryStats", None)
        self._reset: Any = getattr(torch._C, "_cuda_resetPeakMemoryStats", None)

    def sample(self) -> MemorySample:
        device = self.device
        if self._raw is not None:
            s = self._raw(device)
            out = (
                int(s["allocated_bytes"]["all"]["peak"]),
                int(s["reserved_bytes"]["all"]["peak"]),
                int(s["num_alloc_retries"]),
                int(s["num_ooms"]),
            )
        else:  # pragma: no cover - older/newer torch without the private binding
            f = torch.cuda.memory_stats(device)
            out = (
                int(f.get("allocated_bytes.all.peak", 0)),
                int(f.get("reserved_bytes.all.peak", 0)),
                int(f.get("num_alloc_retries", 0)),
                int(f.get("num_ooms", 0)),
            )
        if self.reset_peaks:
            if self._reset is not None:
                self._reset(device)
            else:  # pragma: no cover
                torch.cuda.reset_peak_memory_stats(device)
        return out

    def sample_calls(self) -> tuple[Any, Any] | None:
        """torch's two calls behind :meth:`sample` (the statistics, the peak reset, None
        when peaks are not reset), for the C stamper (_stamp.c) to make them itself; None
        where this torch lacks the private bindings (then only :meth:`sample` reads)."""
        if self._raw is None or (self.reset_peaks and self._reset is None):
            return None
        return self._raw, self._reset if self.reset_peaks else None

    def current(self) -> tuple[int, int]:
        """Bytes allocated and reserved right now (for the OOM event)."""
        device = self.device
        return int(torch.cuda.memory_allocated(device)), int(torch.cuda.memory_reserved(device))


def device_id(props: Any, index: int) -> str:
    """The device's ``hw.id``: its UUID as NVML and DCGM write it (``GPU-<uuid>``), else
    ``cuda:<index>``."""
    uuid = str(getattr(props, "uuid", "") or "")
    if not uuid:
        return f"cuda:{index}"
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
