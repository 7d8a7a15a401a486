"""The efficiency figures as text and span attributes: the run summary's lines (MFU and
why it is absent, the FLOP counts and their cost, data stall, goodput) and a step span's
efficiency attributes. The figures themselves come from :mod:`.efficiency`."""

from __future__ import annotations

from typing import Any

from .. import contract as c
from ..recording.flop_counts import MIXED, CountResult
from .blocks import StepEfficiency
from .efficiency import MAX_COUNTED_SIZES, EfficiencyTracker
from .peaks import is_mig


def span_attributes(eff: StepEfficiency, attrs: dict[str, Any]) -> None:
    """The step span's efficiency attributes (absent, never zero, when unknown)."""
    attrs[c.STEP_DATA_STALL.key] = eff.data_share
    if eff.flops is not None:
        attrs[c.STEP_FLOPS.key] = eff.flops
        attrs[c.STEP_FLOPS_SOURCE.key] = eff.source
    if eff.counted:
        attrs[c.STEP_FLOPS_COUNTED.key] = True
    if eff.flops_per_s is not None:
        attrs[c.STEP_THROUGHPUT_FLOPS.key] = eff.flops_per_s
    if eff.mfu is not None:
        attrs[c.STEP_MFU.key] = eff.mfu


NOTHING_COUNTED = (
    "FlopCounterMode counts matmul, convolution and attention operators only (custom "
    "kernels such as Transformer Engine's or flash-attention's, and CUDA-graph replays, "
    "are invisible to it): no MFU; give flops_per_step= or flops='estimate'"
)


def _of(size: str) -> str:
    return f" ({size})" if size else ""


def _no_peak_reason(dtype: str, device: str) -> str:
    if is_mig(device):
        return (
            f"{device} is a MIG slice, with a share of the GPU's compute the datasheet peaks "
            "do not give: set peak_tflops"
        )
    if dtype == MIXED:
        return (
            "the matmuls ran in several precisions, none for nine tenths of the FLOPs: "
            "set peak_dtype or peak_tflops"
        )
    if not dtype:
        return (
            "the precision the matmuls ran in is unknown (no model given to instrument() and "
            "nothing counted, float32 DTensor parameters, PyTorch's precision settings "
            "refused to say, convolutions and matmuls run at different precisions, or a "
            "compiled forward hid autocast): set peak_dtype"
        )
    return "no peak known for this device and dtype: set peak_tflops"


def summary_lines(tracker: EfficiencyTracker, fmt_seconds: Any) -> list[str]:
    """The run summary's efficiency and goodput lines."""
    lines = []
    if tracker.flop_seconds_total > 0:
        rate = tracker.flops_total / tracker.flop_seconds_total
        text = f"  {rate / 1e12:,.3g} TFLOP/s achieved"
        peak = tracker.peak
        if peak is not None:
            text += (
                f", MFU {100.0 * rate / peak.flops_per_s:.1f}% of {peak.flops_per_s / 1e12:,.4g} "
                f"TFLOP/s ({peak.device} {peak.dtype}, {peak.source})"
            )
        else:
            reason = _no_peak_reason(tracker.peak_dtype_seen, tracker.device_seen)
            text += f", MFU - ({reason})"
        lines.append(text)
    if tracker.not_counted and not tracker.count_results:
        lines.append(f"  FLOPs not counted: {tracker.not_counted}")
    lines += [
        _count_line(tracker, r, fmt_seconds) for r in tracker.count_results[:MAX_COUNTED_SIZES]
    ]
    if tracker.counted_total > 1 or tracker.scaled_steps:
        lines.append(
            f"  FLOP counting: {tracker.counted_total} counted steps took "
            f"{fmt_seconds(tracker.count_seconds)} in all; {tracker.scaled_steps:,} steps of "
            "other batch sizes scaled from the nearest counted one (linear in padded tokens)"
        )
    if tracker.step_total > 0:
        lines.append(f"  data stall {100.0 * tracker.data_total / tracker.step_total:.1f}% "
                     "of step time")  # fmt: skip
    shares = tracker.goodput_shares()
    if shares is not None:
        wall, share = shares
        parts = ", ".join(f"{k} {100.0 * v:.1f}%" for k, v in share.items())
        # (its wall time reaches regions before the first step and after the last one)
        lines.append(f"  goodput {100.0 * share['train']:.1f}% of {fmt_seconds(wall)} (first "
                     f"step or region to last): {parts}")  # fmt: skip
    return lines


def _count_line(tracker: EfficiencyTracker, r: CountResult, fmt_seconds: Any) -> str:
    """The summary's line of one FLOP count (one batch size)."""
    padded = r.padded if r.padded != r.tokens else None
    size = ", ".join(
        f"{v:,} {k}"
        for k, v in (("samples", r.samples), ("tokens", r.tokens), ("padded tokens", padded))
        if v is not None
    )
    if not r.flops:
        return (f"  FLOPs counted at step {r.index}: none the counter can see{_of(size)}"
                f"; {NOTHING_COUNTED}")  # fmt: skip
    text = f"  FLOPs counted at step {r.index}: {r.flops:.4g} per step"
    text += _of(size)
    text += f", matmuls in {r.dtype}" if r.dtype else ""
    if r.uncounted:
        text += (f"; attention ran uncounted ({', '.join(r.uncounted)}: no FLOP formula "
                 "in this torch), so the count and MFU read low")  # fmt: skip
    text += f"; counting step took {fmt_seconds(r.seconds)}"
    typical = tracker.count_typical
    if tracker.count_cost is not None and typical is not None and r is tracker.count_results[0]:
        if tracker.count_cost > 0:
            text += f" (+{fmt_seconds(tracker.count_cost)} over a typical step of "
            text += f"{fmt_seconds(typical)})"
        else:  # the steps after it were as slow or slower (an evaluation among them)
            text += f", no slower than a typical step ({fmt_seconds(typical)})"
    return text
