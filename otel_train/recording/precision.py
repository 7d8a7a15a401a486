"""Which precision a float32 matmul or convolution runs in, and the label MFU's peak takes.

MFU divides achieved FLOP/s by the device's peak for the precision the work ran in, so a
wrong label moves MFU by the ratio of two peaks (fp32 against bf16 on an H100: ~15x). Two
sources of truth are read here, never inside a dispatch mode and never in a way that can
raise into a training step:

- float32 matmuls and convolutions: PyTorch's per-backend precision, the new API first
  (``torch.backends.cuda.matmul.fp32_precision``, ``torch.backends.cudnn.conv
  .fp32_precision``, inheriting from ``torch.backends.fp32_precision`` where they say
  ``"none"``), then the legacy getters (``torch.get_float32_matmul_precision()``,
  ``torch.backends.cudnn.allow_tf32``). Mixing the two APIs makes the legacy getter raise
  (PyTorch refuses to answer which of them wins); the label is then unknown (``""``).
- autocast: the dtype a forward runs in under ``torch.autocast``, read by adapters in
  their forward hook (:func:`autocast_label`), since the parameters stay float32.
- on the CPU, oneDNN's setting (``torch.backends.mkldnn.matmul.fp32_precision``, which
  ``torch.set_float32_matmul_precision`` sets too), never CUDA's TF32 switches.

Usage::

    label = dtype_label(torch.float32, conv=False)   # "fp32", "tf32", or "" when unknown
"""

from __future__ import annotations

from typing import Any

import torch

from .flop_counts import MIXED

_LABELS = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def _new_api(*path: str) -> str:
    """The new API's setting at ``path`` (inheriting where a level says "none"), or ""."""
    node: Any = torch.backends
    levels = [node]
    for name in path:
        node = getattr(node, name, None)
        if node is None:
            return ""
        levels.append(node)
    for level in reversed(levels):  # the most specific level that says something wins
        value = getattr(level, "fp32_precision", None)
        if isinstance(value, str) and value != "none":
            return value
    return ""


def fp32_label(conv: bool = False, cpu: bool = False) -> str:
    """``"tf32"`` or ``"fp32"`` for float32 matmuls (``conv``: convolutions) on CUDA, or
    ``""`` when PyTorch will not say. ``cpu``: on the CPU, where oneDNN's setting
    (``torch.backends.mkldnn``) applies, never CUDA's ("bf16", "tf32", else "fp32").
    Never raises."""
    try:
        if cpu:
            setting = _new_api("mkldnn", "conv" if conv else "matmul")
            return setting if setting in ("bf16", "tf32") else "fp32"
        setting = _new_api("cudnn", "conv") if conv else _new_api("cuda", "matmul")
        if setting:
            return "tf32" if setting == "tf32" else "fp32"
        if conv:
            return "tf32" if torch.backends.cudnn.allow_tf32 else "fp32"
        return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    except Exception:  # the legacy getter refuses when both APIs were used
        return ""


def dtype_label(dtype: torch.dtype, conv: bool = False, cpu: bool = False) -> str:
    """The peak-table label of an operator input's dtype (``""``: unknown; ``cpu``: the
    input is on the CPU). Never raises."""
    label = _LABELS.get(dtype)
    if label is not None:
        return label
    if dtype == torch.float32:
        return fp32_label(conv, cpu)
    name = str(dtype)
    if "float8" in name:
        return "fp8"
    return name.replace("torch.", "")


def autocast_label() -> str | None:
    """The dtype label autocast runs a forward in on CUDA (else the CPU), None when autocast
    is off. Cheap (two C calls); never raises."""
    try:
        for device in ("cuda", "cpu"):
            if torch.is_autocast_enabled(device):
                return dtype_label(torch.get_autocast_dtype(device), cpu=device == "cpu")
    except Exception:  # torch without the device-type arguments
        return None
    return None


def dominant(flops_by_label: dict[str, float], share: float = 0.9) -> str:
    """The label holding at least ``share`` of the FLOPs, else :data:`MIXED` (``""``: none
    ran, or the dominant one is unknown)."""
    total = sum(flops_by_label.values())
    if total <= 0:
        return ""
    label, top = max(flops_by_label.items(), key=lambda kv: kv[1])
    return label if top >= share * total else MIXED


def dispatches_itself(value: Any) -> bool:
    """Whether ``value`` is a tensor of a subclass with its own ``__torch_dispatch__``
    (DTensor, FakeTensor): it computes through other tensors, or not at all."""
    return isinstance(value, torch.Tensor) and (
        type(value).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__
    )


def model_label(models: list[Any], hint: str | None, cpu: bool) -> str:
    """The precision a model's matmuls run in when nothing was counted: autocast's dtype
    when an adapter saw one (``hint``), else the parameters', with float32 resolved per
    kind of layer (matmul or convolution) and device; ``""`` when unsure (no MFU rather
    than a wrong one): no model known (``flops_per_step`` with ``otel_train.step()``, a
    torchtitan trainer), or float32 parameters that are DTensors (FSDP2's mixed-precision
    policy computes them in another dtype). ``cpu``: no CUDA device is in use, so the
    CPU's settings apply (else CUDA's: the peak is the GPU's)."""
    if hint:
        return hint
    first = None
    conv = linear = False
    for model in models:
        for module in model.modules():
            conv = conv or isinstance(module, torch.nn.modules.conv._ConvNd)
            linear = linear or isinstance(module, torch.nn.Linear)
        if first is None:
            first = next((p for p in model.parameters() if p.is_floating_point()), None)
    if first is None:
        return ""
    if first.dtype != torch.float32:
        return dtype_label(first.dtype, cpu=cpu)
    if dispatches_itself(first):
        return ""
    # Convolutions run at cuDNN's (oneDNN's) precision, everything else at the matmuls'.
    labels = {fp32_label(conv=True, cpu=cpu)} if conv else set()
    if linear or not conv:
        labels.add(fp32_label(conv=False, cpu=cpu))
    return labels.pop() if len(labels) == 1 else ""
