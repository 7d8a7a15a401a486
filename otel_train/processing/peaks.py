"""Dense peak FLOP/s of current accelerators, per dtype, from the vendors' datasheets.

MFU is achieved FLOP/s over the device's peak for the dtype the matmuls ran in.
Datasheets usually headline tensor-core figures *with 2:4 sparsity*; every figure
here is the dense one (half the sparse headline where only that is printed), because
training FLOPs are dense. ``fp32`` is the non-tensor-core vector rate; ``tf32`` is
what float32 matmuls get when TF32 is allowed.

Usage::

    peak = lookup_peak("NVIDIA H100 80GB HBM3", "bf16")
    peak.flops_per_s        # 989.4e12
    peak.source             # the datasheet it came from

The ``peak_tflops`` setting overrides the table (and is the only way to get MFU on a
CPU, on a MIG slice or on a device the table does not list).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class PeakRow:
    pattern: str  # regular expression matched against torch.cuda.get_device_name()
    label: str
    tflops: dict[str, float]  # dtype -> dense TFLOP/s
    source: str


@dataclass(frozen=True)
class Peak:
    flops_per_s: float
    dtype: str
    device: str  # the row's label, or "setting" when peak_tflops gave it
    source: str


_H100_SXM = "NVIDIA H100 Tensor Core GPU datasheet (SXM column; sparse figures halved)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (sparse figures halved)"
_BLACKWELL = "NVIDIA HGX B200 / GB200 NVL72 datasheets, per GPU (sparse figures halved)"
_MI300 = "AMD Instinct MI300X / MI325X data sheets (dense matrix peaks)"

# Order matters: the first row whose pattern matches wins, so variants come first.
PEAKS: tuple[PeakRow, ...] = (
    PeakRow(r"GB200", "GB200", {"fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0,
            "fp16": 2500.0, "fp8": 5000.0}, _BLACKWELL),
    PeakRow(r"B200", "B200", {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0,
            "fp8": 4500.0}, _BLACKWELL),
    # GH200's GPU is an H100 with HBM3e: its name also matches "H200", so it comes first.
    PeakRow(r"GH200", "GH200", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5,
            "fp8": 1979.0}, "NVIDIA GH200 Grace Hopper Superchip datasheet (sparse halved)"),
    PeakRow(r"H200.*NVL", "H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5,
            "fp16": 835.5, "fp8": 1670.5}, _H200 + ", NVL column"),
    PeakRow(r"H200", "H200 SXM", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5,
            "fp8": 1979.0}, _H200 + ", SXM column"),
    PeakRow(r"H100.*NVL", "H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5,
            "fp16": 835.5, "fp8": 1670.5}, "NVIDIA H100 NVL product brief (sparse halved)"),
    PeakRow(r"H100.*PCIe", "H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0,
            "fp16": 756.0, "fp8": 1513.0}, "NVIDIA H100 datasheet, PCIe column (sparse halved)"),
    # H800: an H100 with less interconnect bandwidth, the same compute per form factor.
    PeakRow(r"H800.*PCIe", "H800 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0,
            "fp16": 756.0, "fp8": 1513.0}, "NVIDIA H800 PCIe product brief (sparse halved)"),
    PeakRow(r"H800", "H800 SXM", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4,
            "fp16": 989.4, "fp8": 1978.9}, _H100_SXM + "; H800 SXM computes as H100 SXM"),
    PeakRow(r"H100", "H100 SXM", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4,
            "fp16": 989.4, "fp8": 1978.9}, _H100_SXM),
    PeakRow(r"A100|A800", "A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0,
            "fp16": 312.0}, "NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe alike)"),
    PeakRow(r"L40S", "L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05,
            "fp8": 733.0}, "NVIDIA L40S datasheet (sparse figures halved)"),
    PeakRow(r"L40\b", "L40", {"fp32": 90.5, "tf32": 90.5, "bf16": 181.0, "fp16": 181.0,
            "fp8": 362.0}, "NVIDIA L40 datasheet (sparse figures halved)"),
    PeakRow(r"\bL4\b", "L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0,
            "fp8": 242.5}, "NVIDIA L4 datasheet (sparse figures halved)"),
    PeakRow(r"MI355X", "MI355X", {"fp32": 157.3, "bf16": 2516.6, "fp16": 2516.6,
            "fp8": 5033.2}, "AMD Instinct MI355X data sheet (dense)"),
    PeakRow(r"MI325X", "MI325X", {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4,
            "fp16": 1307.4, "fp8": 2614.9}, _MI300),
    PeakRow(r"MI300X", "MI300X", {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4,
            "fp16": 1307.4, "fp8": 2614.9}, _MI300),
    # Each MI250X package shows up as two devices (one per GCD): half the package peak.
    PeakRow(r"MI250X", "MI250X GCD", {"fp32": 47.85, "bf16": 191.5, "fp16": 191.5},
            "AMD Instinct MI250X data sheet, halved per GCD (fp32: matrix rate)"),
    PeakRow(r"MI250", "MI250 GCD", {"fp32": 45.25, "bf16": 181.0, "fp16": 181.0},
            "AMD Instinct MI250 data sheet, halved per GCD (fp32: matrix rate)"),
)  # fmt: skip


def is_mig(device_name: str | None) -> bool:
    """Whether the device is a MIG slice of a GPU (CUDA names it ``<GPU> MIG 1g.10gb``): it
    has a share of the GPU's compute, so the table's whole-GPU peaks do not apply."""
    return bool(device_name) and re.search(r"\bMIG\b", device_name or "") is not None


def find_row(device_name: str) -> PeakRow | None:
    for row in PEAKS:
        if re.search(row.pattern, device_name, flags=re.IGNORECASE):
            return row
    return None


def lookup_peak(
    device_name: str | None, dtype: str, override_tflops: float | None = None
) -> Peak | None:
    """The peak to compute MFU against, or None when none is known (MFU stays absent)."""
    if override_tflops is not None:
        return Peak(override_tflops * 1e12, dtype, "setting", "peak_tflops setting")
    if not device_name or is_mig(device_name):
        return None  # (a MIG slice: only peak_tflops gives its peak)
    row = find_row(device_name)
    if row is None:
        return None
    tflops = row.tflops.get(dtype)
    if dtype == "tf32" and row.label.startswith("MI") and not rocm_tf32_allowed():
        tflops = None  # ROCm runs float32 GEMMs at the fp32 rate unless hipBLASLt allows TF32
    if tflops is None and dtype == "tf32":
        tflops = row.tflops.get("fp32")  # no TF32 units: float32 matmuls run at the fp32 rate
    if tflops is None:
        return None
    return Peak(tflops * 1e12, dtype, row.label, row.source)


def rocm_tf32_allowed() -> bool:
    """On ROCm, float32 GEMMs use TF32 units only when hipBLASLt is told to."""
    return os.environ.get("HIPBLASLT_ALLOW_TF32", "") not in ("", "0")
