"""The telemetry contract: every span, attribute and metric otel-train emits.

One telemetry contract, kept in one package and read as one module: import it as
``from otel_train import contract`` (or ``from otel_train.contract import X``); every
public name of its parts is re-exported here. It is the single source of truth.
``docs/telemetry.md`` is generated from it (``otel-train telemetry > docs/telemetry.md``,
checked by a test), the recording core takes its names from here, and the dashboard
checks translate these names to Prometheus names with :func:`prometheus_names`.

Its parts, each importing only those below it (and nothing else of otel-train)::

    markdown    ─► all below      render_markdown(): the text of docs/telemetry.md
    conventions ─► metrics        CONVENTIONS (semantic conventions), PEER_NAMES
    schema      ─► metrics, specs SCHEMA_URL, DEPRECATED_METRICS, render_schema()
    derived     ─► metrics, prometheus, specs   DERIVED: figures computed in PromQL
    prometheus  ─► specs          prometheus_names(): OTel name + unit -> Prometheus series
    spans       ─► attributes, events, specs   STEP_SPAN, PHASE_SPAN, ADAPTER_PHASES
    metrics     ─► specs          every MetricSpec, METRICS, A_* keys, DURATION_* buckets
    events      ─► specs          OOM, profile and memory-snapshot span events, EVENTS
    attributes  ─► specs          step, phase and resource AttributeSpecs
    specs                         AttributeSpec, SpanSpec, MetricSpec, DerivedSpec, SCOPE_NAME

``python -m otel_train.contract`` (``__main__.py``) prints the reference.

Usage::

    from otel_train import contract
    contract.PHASE_DURATION.name        # "otel_train.phase.duration"
    contract.prometheus_names(contract.PHASE_DURATION)
"""

from __future__ import annotations

from .attributes import (
    LINK_STALENESS,
    PHASE_ALLOC_RETRIES,
    PHASE_CLOCK,
    PHASE_DEVICE_DURATION,
    PHASE_HOST_DURATION,
    PHASE_NAME,
    PHASE_OOMS,
    PHASE_PEAK_ALLOCATED,
    PHASE_PEAK_RESERVED,
    PHASE_PEAK_UTILIZATION,
    POLICY_VERSION,
    RANK,
    RESOURCE_ATTRIBUTES,
    RESOURCE_JOB,
    RESOURCE_LOCAL_RANK,
    RESOURCE_NODE_RANK,
    RESOURCE_RANK,
    RESOURCE_ROLE,
    RESOURCE_WORLD_SIZE,
    STEP_DATA_STALL,
    STEP_DEVICE_DURATION,
    STEP_FLOPS,
    STEP_FLOPS_COUNTED,
    STEP_FLOPS_SOURCE,
    STEP_HOST_DURATION,
    STEP_INDEX,
    STEP_MFU,
    STEP_SAMPLED_BECAUSE,
    STEP_SAMPLES,
    STEP_THROUGHPUT_FLOPS,
    STEP_THROUGHPUT_SAMPLES,
    STEP_THROUGHPUT_TOKENS,
    STEP_TOKENS,
)
from .conventions import (
    CONVENTIONS,
    PEER_NAMES,
    SEMCONV_NAMESPACES,
    SEMCONV_VERSION,
    Convention,
)
from .derived import (
    DERIVED,
    DERIVED_DATA_STALL,
    DERIVED_DEVICE_PEAK_FLOPS,
    DERIVED_GOODPUT,
    DERIVED_PHASE_MEMORY_UTILIZATION,
    DERIVED_THROUGHPUT_SAMPLES,
    DERIVED_THROUGHPUT_TOKENS,
)
from .events import (
    EVENTS,
    MEMORY_SNAPSHOT_EVENT,
    MEMORY_SNAPSHOT_EVENT_ATTRIBUTES,
    MEMORY_SNAPSHOT_PATH,
    MEMORY_SNAPSHOT_REASON,
    OOM_EVENT,
    OOM_EVENT_ATTRIBUTES,
    PROFILE_EVENT,
    PROFILE_EVENT_ATTRIBUTES,
)
from .markdown import (
    render_markdown,
)
from .metrics import (
    A_CATEGORY,
    A_CLOCK,
    A_DTYPE,
    A_HW_ID,
    A_KIND,
    A_NAME,
    A_PHASE,
    A_REASON,
    DEVICE_MEMORY_LIMIT,
    DROPPED,
    DURATION_BUCKETS,
    DURATION_MAX_SCALE,
    DURATION_MAX_SIZE,
    HOST_MEMORY_TOTAL,
    METRIC_ATTRIBUTES,
    METRICS,
    MFU,
    OVERHEAD,
    PENDING_STEPS,
    PHASE_DURATION,
    PHASE_MEMORY_PEAK,
    POLICY_STALENESS,
    PROCESS_MEMORY_PEAK_RSS,
    PROCESS_MEMORY_RSS,
    RUN_TIME,
    SAMPLES,
    SCALAR,
    SPANS_EMITTED,
    STALENESS_BUCKETS,
    STEP_DURATION,
    STEPS,
    THROUGHPUT_FLOPS,
    TOKENS,
)
from .prometheus import (
    prometheus_base_name,
    prometheus_names,
)
from .schema import (
    DEPRECATED_METRICS,
    REMOVED_IN,
    SCHEMA_FAMILY,
    SCHEMA_FILE_FORMAT,
    SCHEMA_URL,
    SCHEMA_VERSION,
    SCHEMA_VERSIONS,
    render_schema,
)
from .spans import (
    ADAPTER_PHASES,
    PHASE_SPAN,
    SPANS,
    STEP_SPAN,
)
from .specs import (
    SCOPE_NAME,
    AttributeSpec,
    DerivedSpec,
    MetricSpec,
    SpanSpec,
)

__all__ = [
    "ADAPTER_PHASES",
    "A_CATEGORY",
    "A_CLOCK",
    "A_DTYPE",
    "A_HW_ID",
    "A_KIND",
    "A_NAME",
    "A_PHASE",
    "A_REASON",
    "CONVENTIONS",
    "DEPRECATED_METRICS",
    "DERIVED",
    "DERIVED_DATA_STALL",
    "DERIVED_DEVICE_PEAK_FLOPS",
    "DERIVED_GOODPUT",
    "DERIVED_PHASE_MEMORY_UTILIZATION",
    "DERIVED_THROUGHPUT_SAMPLES",
    "DERIVED_THROUGHPUT_TOKENS",
    "DEVICE_MEMORY_LIMIT",
    "DROPPED",
    "DURATION_BUCKETS",
    "DURATION_MAX_SCALE",
    "DURATION_MAX_SIZE",
    "EVENTS",
    "HOST_MEMORY_TOTAL",
    "LINK_STALENESS",
    "MEMORY_SNAPSHOT_EVENT",
    "MEMORY_SNAPSHOT_EVENT_ATTRIBUTES",
    "MEMORY_SNAPSHOT_PATH",
    "MEMORY_SNAPSHOT_REASON",
    "METRICS",
    "METRIC_ATTRIBUTES",
    "MFU",
    "OOM_EVENT",
    "OOM_EVENT_ATTRIBUTES",
    "OVERHEAD",
    "PEER_NAMES",
    "PENDING_STEPS",
    "PHASE_ALLOC_RETRIES",
    "PHASE_CLOCK",
    "PHASE_DEVICE_DURATION",
    "PHASE_DURATION",
    "PHASE_HOST_DURATION",
    "PHASE_MEMORY_PEAK",
    "PHASE_NAME",
    "PHASE_OOMS",
    "PHASE_PEAK_ALLOCATED",
    "PHASE_PEAK_RESERVED",
    "PHASE_PEAK_UTILIZATION",
    "PHASE_SPAN",
    "POLICY_STALENESS",
    "POLICY_VERSION",
    "PROCESS_MEMORY_PEAK_RSS",
    "PROCESS_MEMORY_RSS",
    "PROFILE_EVENT",
    "PROFILE_EVENT_ATTRIBUTES",
    "RANK",
    "REMOVED_IN",
    "RESOURCE_ATTRIBUTES",
    "RESOURCE_JOB",
    "RESOURCE_LOCAL_RANK",
    "RESOURCE_NODE_RANK",
    "RESOURCE_RANK",
    "RESOURCE_ROLE",
    "RESOURCE_WORLD_SIZE",
    "RUN_TIME",
    "SAMPLES",
    "SCALAR",
    "SCHEMA_FAMILY",
    "SCHEMA_FILE_FORMAT",
    "SCHEMA_URL",
    "SCHEMA_VERSION",
    "SCHEMA_VERSIONS",
    "SCOPE_NAME",
    "SEMCONV_NAMESPACES",
    "SEMCONV_VERSION",
    "SPANS",
    "SPANS_EMITTED",
    "STALENESS_BUCKETS",
    "STEPS",
    "STEP_DATA_STALL",
    "STEP_DEVICE_DURATION",
    "STEP_DURATION",
    "STEP_FLOPS",
    "STEP_FLOPS_COUNTED",
    "STEP_FLOPS_SOURCE",
    "STEP_HOST_DURATION",
    "STEP_INDEX",
    "STEP_MFU",
    "STEP_SAMPLED_BECAUSE",
    "STEP_SAMPLES",
    "STEP_SPAN",
    "STEP_THROUGHPUT_FLOPS",
    "STEP_THROUGHPUT_SAMPLES",
    "STEP_THROUGHPUT_TOKENS",
    "STEP_TOKENS",
    "THROUGHPUT_FLOPS",
    "TOKENS",
    "AttributeSpec",
    "Convention",
    "DerivedSpec",
    "MetricSpec",
    "SpanSpec",
    "prometheus_base_name",
    "prometheus_names",
    "render_markdown",
    "render_schema",
]
