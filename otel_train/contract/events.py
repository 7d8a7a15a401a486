"""Span events of the telemetry contract (other than ``exception``): their names, their
attributes and the span each appears on; and the events sent as log records (the logs
signal). otel_train/debug/ mirrors the names (a test keeps them equal)."""

from __future__ import annotations

from .attributes import (
    COLLECTIVE_GROUP,
    COLLECTIVE_OP,
    COLLECTIVE_SEQ,
    PHASE_NAME,
    STEP_INDEX,
)
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

# --- events sent as log records (the logs signal, with event_name) -------------------

HANG_SECONDS = AttributeSpec(
    "otel_train.hang.seconds",
    "double",
    "s",
    "Seconds since the training thread's last phase boundary (on otel_train.hang.resolved: "
    "the whole stall).",
)
HANG_AFTER = AttributeSpec(
    "otel_train.hang.after",
    "double",
    "s",
    "The limit that was passed (hang_after, or the open region's budget).",
)
HANG_STACKTRACE = AttributeSpec(
    "code.stacktrace",
    "string",
    "",
    "The Python stack of every thread of the training process, the training thread first "
    "(semantic conventions code.stacktrace).",
)
HANG_REGION = AttributeSpec(
    "otel_train.hang.region",
    "string",
    "",
    "The otel-train region open, if any (evaluation, checkpoint).",
)
HANG_FLIGHT_RECORDER = AttributeSpec(
    "otel_train.hang.flight_recorder",
    "string",
    "",
    "Absolute path of PyTorch's Flight Recorder dump (pickle) written at the hang, when "
    "the Flight Recorder is on (TORCH_FR_BUFFER_SIZE).",
)
HANG_EVENT = "otel_train.hang"
HANG_EVENT_ATTRIBUTES = (
    HANG_SECONDS,
    HANG_AFTER,
    STEP_INDEX,
    PHASE_NAME,
    HANG_REGION,
    HANG_STACKTRACE,
    COLLECTIVE_OP,
    COLLECTIVE_SEQ,
    COLLECTIVE_GROUP,
    HANG_FLIGHT_RECORDER,
)
HANG_RESOLVED_EVENT = "otel_train.hang.resolved"
HANG_RESOLVED_ATTRIBUTES = (HANG_SECONDS, STEP_INDEX)

# Log-record events: name -> (when it is sent, severity, attributes).
LOG_EVENTS: dict[str, tuple[str, str, tuple[AttributeSpec, ...]]] = {
    HANG_EVENT: (
        "A rank whose training thread made no progress (no phase boundary) for hang_after "
        "seconds: at most three per stall (at 1x, 2x and 4x the limit). Carries the open "
        "step's trace and span ids (that step is traced).",
        "WARN",
        HANG_EVENT_ATTRIBUTES,
    ),
    HANG_RESOLVED_EVENT: (
        "Progress resumed after an otel_train.hang record.",
        "INFO",
        HANG_RESOLVED_ATTRIBUTES,
    ),
}
