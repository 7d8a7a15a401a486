"""otel-train's telemetry schema: its version and URL (every tracer and meter of
otel-train carries the URL as its ``schema_url``), the renames between versions, and the
schema file (OpenTelemetry schema file format 1.1.0) that ``make docs`` writes to
``schemas/<version>`` (a test keeps the file identical).

Versions of the names, not of the package: 0.1.0 is what otel-train emitted before it
had a schema (no ``schema_url``); 0.2.0 took the semantic conventions' names for the
figures they define (conventions.py), and keeps each old name for one release as a
deprecated alias, emitted beside the new one (:data:`DEPRECATED_METRICS`).
"""

from __future__ import annotations

from .metrics import DEVICE_MEMORY_LIMIT, HOST_MEMORY_TOTAL, PROCESS_MEMORY_RSS
from .specs import MetricSpec

SCHEMA_FAMILY = "https://otel-train.github.io/schemas"
SCHEMA_VERSION = "0.2.0"
SCHEMA_URL = f"{SCHEMA_FAMILY}/{SCHEMA_VERSION}"
SCHEMA_FILE_FORMAT = "1.1.0"
REMOVED_IN = "0.3.0"  # the release that stops emitting the deprecated aliases


def _alias(old: str, new: MetricSpec) -> MetricSpec:
    return MetricSpec(
        old,
        "gauge",
        new.unit,
        f"Deprecated since {SCHEMA_VERSION}, removed in {REMOVED_IN}: the same value as "
        f"`{new.name}` (without its attributes).",
    )


# (deprecated alias, the metric that replaces it): both are emitted until REMOVED_IN.
DEPRECATED_METRICS: tuple[tuple[MetricSpec, MetricSpec], ...] = (
    (_alias("otel_train.process.memory.rss", PROCESS_MEMORY_RSS), PROCESS_MEMORY_RSS),
    (_alias("otel_train.host.memory.total", HOST_MEMORY_TOTAL), HOST_MEMORY_TOTAL),
    (_alias("otel_train.device.memory.limit", DEVICE_MEMORY_LIMIT), DEVICE_MEMORY_LIMIT),
)

# Every version, newest first, with the metric renames (old -> new) it made.
SCHEMA_VERSIONS: dict[str, dict[str, str]] = {
    "0.2.0": {old.name: new.name for old, new in DEPRECATED_METRICS},
    "0.1.0": {},
}


def render_schema() -> str:
    """The schema file of :data:`SCHEMA_VERSION` (YAML), every version in it."""
    out = [
        "# otel-train's telemetry schema (OpenTelemetry schema file format), generated from",
        "# otel_train/contract/schema.py by `make docs`. Do not edit by hand.",
        f"file_format: {SCHEMA_FILE_FORMAT}",
        f"schema_url: {SCHEMA_URL}",
        "versions:",
    ]
    for version, renames in SCHEMA_VERSIONS.items():
        if not renames:
            out.append(f"  {version}:")
            continue
        out += [f"  {version}:", "    metrics:", "      changes:", "        - rename_metrics:"]
        out += [f"            {old}: {new}" for old, new in renames.items()]
    return "\n".join(out) + "\n"
