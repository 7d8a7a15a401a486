"""The verdicts' thresholds (processing/verdicts.py): when a figure of a run names its
bottleneck. Declared and checked as the other settings are (``values``), each from a
keyword (``otel-train compare --verdict NAME=VALUE``), else the ``OTEL_TRAIN_<NAME>``
environment variable, else its default; a bad value raises :class:`ConfigError` naming
the setting and the accepted values."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import values as v
from .values import ConfigError

ENV_PREFIX = "OTEL_TRAIN_"


def _share(doc: str, default: float) -> Any:
    return field(default=default, metadata={"parse": v.float_range(0.0, 1.0), "doc": doc})


@dataclass(frozen=True)
class VerdictSettings:
    verdict_data_stall: float = _share(
        "Input-bound: the median step waits for its batch this share of its time or more.", 0.05
    )
    verdict_collectives: float = _share(
        "Collectives: the steps wait in collectives this share of their time or more.", 0.10
    )
    verdict_memory: float = _share(
        "Memory near the limit: a phase's peak reserved memory is this share of the device "
        "or more.",
        0.90,
    )
    verdict_fragmentation: float = _share(
        "Fragmentation: reserved less allocated is this share of reserved or more at a "
        "phase's peak (any allocator retry also triggers).",
        0.30,
    )
    verdict_straggler: float = field(
        default=1.10,
        metadata={
            "parse": v.float_range(1.0, 100.0),
            "doc": "Straggler: a rank's median step less its waits in collectives is this "
            "many times the ranks' median.",
        },
    )
    verdict_drift: float = _share(
        "Drift: the last third of the steady steps' median differs from the first third's "
        "by this share or more.",
        0.10,
    )
    verdict_dropped: int = field(
        default=1,
        metadata={
            "parse": v.int_range(1, 10**12),
            "doc": "Telemetry drops: this many dropped items (spans, steps, points) or more.",
        },
    )
    verdict_unsteady: float = _share(
        "Unsteady steps: this share of the steady steps or more took over twice the median "
        "step (recompiles, a counted or profiled step).",
        0.05,
    )

    @classmethod
    def resolve(cls, overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> VerdictSettings:  # fmt: skip
        env = os.environ if environ is None else environ
        overrides = dict(overrides or {})
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ConfigError(f"unknown verdict setting(s) {', '.join(unknown)}; accepted: "
                              f"{', '.join(known)}")  # fmt: skip
        values: dict[str, Any] = {}
        for name, f in known.items():
            env_name = ENV_PREFIX + name.upper()
            if name in overrides:
                raw, source = overrides[name], f"--verdict {name}="
            elif env_name in env:
                raw, source = env[env_name], f"environment variable {env_name}"
            else:
                continue
            try:
                values[name] = f.metadata["parse"](name, raw)
            except ConfigError as err:
                raise ConfigError(
                    f"otel_train setting '{name}' (from {source}) {err}; got {v.shown(raw)}"
                ) from None
        return cls(**values)


def verdict_table() -> str:
    """Markdown table of the thresholds (docs/compare.md)."""
    rows = ["| setting | environment | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(VerdictSettings):
        env = f"`{ENV_PREFIX}{f.name.upper()}`"
        rows.append(f"| `{f.name}` | {env} | `{f.default!r}` | {f.metadata['doc']} |")
    return "\n".join(rows)
