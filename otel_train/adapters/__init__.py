"""Trainer adapters: thin leaves over the recording core, one module per trainer shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Instrumentation

SUPPORTED = (
    "a torch.nn.Module (plain loop; optional optimizer= and dataloader=)",
    "any object with phases={'phase': 'method name', ...} (optional step='method name')",
)


def select(
    target: Any,
    *,
    optimizer: Any = None,
    dataloader: Any = None,
    phases: Any = None,
    step: Any = None,
    count_batch: Any = None,
) -> Callable[[Instrumentation], None]:
    """Validate everything and return the function that attaches; raises before any change."""
    if count_batch is not None and not callable(count_batch):
        raise TypeError("otel_train.instrument(): count_batch= must be callable(batch) -> "
                        "(samples, tokens)")
    if phases is not None or step is not None:
        if optimizer is not None or dataloader is not None:
            raise TypeError("otel_train.instrument(): phases=/step= cannot be combined with "
                            "optimizer=/dataloader=")
        from . import methods

        if phases is None:
            raise TypeError("otel_train.instrument(): step= needs phases= as well")
        checked = methods.validate(target, phases, step)
        return lambda inst: methods.attach(inst, target, checked, step)
    import torch

    if isinstance(target, torch.nn.Module):
        from . import torch_loop

        torch_loop.validate(target, optimizer, dataloader)
        return lambda inst: torch_loop.attach(inst, target, optimizer, dataloader, count_batch)
    raise TypeError(
        f"otel_train.instrument() does not support {type(target).__module__}."
        f"{type(target).__qualname__}; supported: " + "; ".join(SUPPORTED)
    )


def kind_of(target: Any, phases: Any) -> str:
    return "methods" if phases is not None else "torch-loop"


__all__ = ["SUPPORTED", "Instrumentation", "kind_of", "select"]
