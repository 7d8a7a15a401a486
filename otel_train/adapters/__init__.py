"""Trainer adapters: thin leaves over the recording core, one module per trainer shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Instrumentation

SUPPORTED = (
    "a torch.nn.Module (plain loop; optional optimizer= and dataloader=)",
    "any object with phases={'phase': 'method name', ...} (optional step='method name')",
    "a transformers.Trainer (pip install 'otel-train[hf]')",
    "a Lightning Trainer (pip install 'otel-train[lightning]')",
    "a torchtitan-style trainer (train_step, forward_backward_step and next_batch or "
    "batch_generator methods)",
)


def _is_trainer_of(target: Any, packages: tuple[str, ...]) -> bool:
    """A class named Trainer from one of ``packages`` in the MRO: no framework import."""
    for cls in type(target).__mro__:
        module = getattr(cls, "__module__", "") or ""
        if cls.__name__ == "Trainer" and any(
            module == p or module.startswith(p + ".") for p in packages
        ):
            return True
    return False


_HF = ("transformers",)
_LIGHTNING = ("lightning.pytorch", "pytorch_lightning")


def _kind(target: Any, phases: Any) -> str:
    """The one framework detection: the kind of adapter ``target`` gets.

    "methods" with ``phases=``; else "hf" or "lightning" for those Trainers, "torchtitan"
    for that shape, and "torch-loop" for anything else (``select`` then checks it is a
    torch.nn.Module). Framework packages are never imported here.
    """
    if phases is not None:
        return "methods"
    if _is_trainer_of(target, _HF):
        return "hf"
    if _is_trainer_of(target, _LIGHTNING):
        return "lightning"
    from . import torchtitan

    return "torchtitan" if torchtitan.matches(target) else "torch-loop"


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
        raise TypeError(
            "otel_train.instrument(): count_batch= must be callable(batch) -> (samples, tokens)"
        )
    if phases is not None or step is not None:
        if optimizer is not None or dataloader is not None:
            raise TypeError(
                "otel_train.instrument(): phases=/step= cannot be combined with "
                "optimizer=/dataloader="
            )
        from . import methods

        if phases is None:
            raise TypeError("otel_train.instrument(): step= needs phases= as well")
        checked = methods.validate(target, phases, step)
        return lambda inst: methods.attach(inst, target, checked, step)
    kind = _kind(target, phases)
    if kind == "hf":
        from . import hf

        hf.validate(target, optimizer, dataloader)
        return lambda inst: hf.attach(inst, target, count_batch)
    if kind == "lightning":
        from . import lightning

        lightning.validate(target, optimizer, dataloader)
        return lambda inst: lightning.attach(inst, target, count_batch)
    if kind == "torchtitan":
        from . import torchtitan

        torchtitan.validate(target, optimizer, dataloader)
        return lambda inst: torchtitan.attach(inst, target, count_batch)
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
    """The kind of adapter ``target`` gets (the Instrumentation's ``kind``)."""
    return _kind(target, phases)


__all__ = ["SUPPORTED", "Instrumentation", "kind_of", "select"]
