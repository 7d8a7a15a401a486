"""Any object whose methods are the phases: the RL-loop shape.

``instrument(loop, phases={"rollout": "generate", "train": "train_step"}, step="run_iteration")``
wraps ``loop.generate`` in a ``rollout`` phase, ``loop.train_step`` in a ``train``
phase, and ``loop.run_iteration`` in a step. Without ``step=``, a step closes when a
top-level phase repeats (rollout, train, ..., rollout starts the next step). Async
methods are wrapped as async. The wrappers live in the instance's ``__dict__`` and
are removed exactly by ``uninstrument()``; copy an object after uninstrumenting it.

Telemetry emitted: the ``otel_train.step`` trace and every metric in the contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..settings import ConfigError
from .base import Instrumentation, time_methods


def validate(target: Any, phases: Any, step: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(phases, Mapping) or not phases:
        raise ConfigError(
            "otel_train.instrument(): phases= must be a non-empty mapping of phase name to "
            "method name (or a list of method names), e.g. {'rollout': 'generate'}"
        )
    out: dict[str, tuple[str, ...]] = {}
    seen: set[str] = set()
    for phase, methods in phases.items():
        if not isinstance(phase, str) or not phase or len(phase) > 128:
            raise ConfigError(
                f"otel_train.instrument(): phase names must be non-empty strings of at most 128 "
                f"characters; got {phase!r}"
            )
        if isinstance(methods, str):
            names: tuple[Any, ...] = (methods,)
        elif isinstance(methods, (list, tuple)) and methods:
            names = tuple(methods)
        else:
            raise ConfigError(
                f"otel_train.instrument(): phases[{phase!r}] must be a method name or a "
                f"non-empty list of method names; got {methods!r}"[:300]
            )
        for name in names:
            _check_method(target, name, f"phases[{phase!r}]")
            if name in seen:
                raise ConfigError(
                    f"otel_train.instrument(): method {name!r} is mapped to more than one phase"
                )
            seen.add(name)
        out[phase] = names
    if step is not None:
        _check_method(target, step, "step")
        if step in seen:
            raise ConfigError(f"otel_train.instrument(): step={step!r} is also mapped to a phase")
    return out


def _check_method(target: Any, name: Any, where: str) -> None:
    if not isinstance(name, str):
        raise ConfigError(f"otel_train.instrument(): {where} must name a method, got {name!r}")
    value = getattr(target, name, None)
    if value is None or not callable(value):
        methods = sorted(
            n for n in dir(target) if not n.startswith("_") and callable(getattr(target, n, None))
        )
        raise ConfigError(
            f"otel_train.instrument(): {where} names {name!r}, which is not a method of "
            f"{type(target).__name__}; its methods: {', '.join(methods[:30])}"
        )


def attach(
    inst: Instrumentation, target: Any, phases: dict[str, tuple[str, ...]], step: str | None
) -> None:
    time_methods(inst, target, phases, step)
