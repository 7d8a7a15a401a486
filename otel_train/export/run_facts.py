"""Each rank's run facts: what a run record's telemetry does not say about the run's
set-up, for ``otel-train compare`` to tell two runs apart (contract.RUN_FACTS): torch's
version, whether a model ran under torch.compile, otel-train's version and the settings
that differ from their defaults. Those known at start are on otel-train's own SDK
resource too (export/resource.py), and the compile state on a gauge
(contract.TORCH_COMPILED), for a job read from a live stack.

The training process writes them at shutdown, once it knows whether anything was
compiled, as ``<prefix>.run.json`` beside the rank's record files (only when the record's
directory is there and its own): written to a new file, mode 0600, renamed over the
name, so a link planted there is replaced, never written through."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import contract as c
from ..settings import Settings
from .record import RecordPlan
from .run_directory import not_own_directory

_log = logging.getLogger("otel_train")

FACTS_SUFFIX = ".run.json"
# Where the telemetry goes and what it is called, not how the run is measured.
NOT_COMPARED = frozenset({
    "service_name", "default_service_name", "role", "otlp_endpoint", "prometheus_host",
    "prometheus_port", "run_dir", "debug_dir",
})  # fmt: skip


def changed_settings(settings: Settings) -> str:
    """The settings that differ from their defaults, ``name=value`` joined by ', '."""
    defaults = Settings()
    pairs = [
        f"{f.name}={getattr(settings, f.name)!r}"
        for f in dataclasses.fields(Settings)
        if f.name not in NOT_COMPARED and getattr(settings, f.name) != getattr(defaults, f.name)
    ]
    return ", ".join(pairs)


def torch_version() -> str | None:
    """``torch.__version__``, read without importing torch where it is not imported (the
    sidecar never imports it): from the package's generated ``torch/version.py`` (the
    distribution's version lacks the local part, ``+cu132``), else the distribution's;
    None when torch is not installed."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(getattr(torch, "__version__", "")) or None
    try:
        spec = importlib.util.find_spec("torch")
        text = Path(spec.origin).with_name("version.py").read_text() if spec and spec.origin else ""
        found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        return found.group(1) if found else importlib.metadata.version("torch")
    except (OSError, ImportError, ValueError):
        return None


def start_facts(settings: Settings, version: str) -> dict[str, Any]:
    """The run facts known when the process starts (contract.START_FACTS): also resource
    attributes of otel-train's own SDK, so that a live stack holds them (target_info)."""
    return {
        c.RUN_TORCH_VERSION.key: torch_version(),
        c.RUN_VERSION.key: version,
        c.RUN_SETTINGS.key: changed_settings(settings),
    }


def run_facts(settings: Settings, version: str, compiled: bool) -> dict[str, Any]:
    return {**start_facts(settings, version), c.RUN_TORCH_COMPILE.key: compiled}


def write_run_facts(plan: RecordPlan, facts: dict[str, Any]) -> bool:
    """Write ``facts`` beside the record; False when its directory is not there (nothing
    was recorded) or not its own. OSError when the write fails."""
    if not os.path.isdir(plan.directory) or not_own_directory(plan.directory):
        return False
    path = os.path.join(plan.directory, plan.prefix + FACTS_SUFFIX)
    temporary = f"{path}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(facts, f, sort_keys=True)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return True


def record_run_facts(plan: RecordPlan, settings: Settings, version: str,
                     compiled: Callable[[], bool]) -> None:  # fmt: skip
    """The run facts beside the record, at shutdown; a failure is logged, never raised."""
    try:
        write_run_facts(plan, run_facts(settings, version, compiled()))
    except Exception as err:
        _log.warning("otel-train: the run facts were not written beside the record (%s)", err)
