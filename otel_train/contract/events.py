"""Span events of the telemetry contract (other than ``exception``): their names, their
attributes and the span each appears on. otel_train/debug/ mirrors the names (a test
keeps them equal)."""

from __future__ import annotations

from .specs import AttributeSpec

# --- span events -------------------------------------------------------------------

OOM_EVENT = "otel_train.oom"
OOM_EVENT_ATTRIBUTES = (
    AttributeSpec("otel_train.memory.allocated", "int", "By", "Bytes allocated at the OOM."),
    AttributeSpec("otel_train.memory.reserved", "int", "By", "Bytes reserved at the OOM."),
    AttributeSpec("otel_train.memory.device_total", "int", "By", "Total device memory."),
)

PROFILE_EVENT = "otel_train.profile"
PROFILE_EVENT_ATTRIBUTES = (
    AttributeSpec(
        "otel_train.profile.path",
        "string",
        "",
        "Absolute path of the torch.profiler trace (Chrome trace JSON) covering this step.",
    ),
    AttributeSpec("otel_train.profile.first_step", "int", "", "First step the trace covers."),
    AttributeSpec("otel_train.profile.last_step", "int", "", "Last step the trace covers."),
)
MEMORY_SNAPSHOT_PATH = AttributeSpec(
    "otel_train.memory_snapshot.path",
    "string",
    "",
    "Absolute path of the CUDA memory snapshot (pickle; open at pytorch.org/memory_viz).",
)
MEMORY_SNAPSHOT_REASON = AttributeSpec(
    "otel_train.memory_snapshot.reason",
    "string",
    "",
    "oom (dumped at an OutOfMemoryError) or window (the end of a step window).",
)
MEMORY_SNAPSHOT_EVENT = "otel_train.memory_snapshot"
MEMORY_SNAPSHOT_EVENT_ATTRIBUTES = (MEMORY_SNAPSHOT_PATH, MEMORY_SNAPSHOT_REASON)

# Span events other than `exception`: name -> (where it appears, attributes).
EVENTS: dict[str, tuple[str, tuple[AttributeSpec, ...]]] = {
    OOM_EVENT: ("Phase span, on a CUDA out-of-memory error.", OOM_EVENT_ATTRIBUTES),
    PROFILE_EVENT: (
        "Step span of every step the profiler window covers (`profile_steps`).",
        PROFILE_EVENT_ATTRIBUTES,
    ),
    MEMORY_SNAPSHOT_EVENT: (
        "The failing phase span when a CUDA OOM was dumped (`memory_snapshot='oom'`), or the "
        "step span of a snapshot window's last step.",
        MEMORY_SNAPSHOT_EVENT_ATTRIBUTES,
    ),
}
