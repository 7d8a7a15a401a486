"""The telemetry contract: every span, attribute and metric otel-train emits.

This module is the single source of truth. ``docs/telemetry.md`` is generated
from it (``otel-train telemetry > docs/telemetry.md``, checked by a test), the
recording core takes its names from here, and the dashboard checks translate these
names to Prometheus names with :func:`prometheus_names`.

Usage::

    from otel_train import contract
    contract.PHASE_DURATION.name        # "otel_train.phase.duration"
    contract.prometheus_names(contract.PHASE_DURATION)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCOPE_NAME = "otel_train"

# Seconds. Covers sub-millisecond CPU phases to multi-minute RL rollouts.
DURATION_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 600.0,
)  # fmt: skip


@dataclass(frozen=True)
class AttributeSpec:
    key: str
    type: str  # "string" | "int" | "double" | "boolean"
    unit: str  # UCUM unit of the value, "" when it has none
    description: str


@dataclass(frozen=True)
class SpanSpec:
    name: str  # a literal name, or a pattern in angle brackets for phase spans
    description: str
    attributes: tuple[AttributeSpec, ...]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    instrument: str  # "histogram" | "counter" | "gauge"
    unit: str
    description: str
    attributes: tuple[str, ...] = ()


# --- span attributes ---------------------------------------------------------

STEP_INDEX = AttributeSpec("otel_train.step.index", "int", "", "Training step index, from 0.")
STEP_SAMPLES = AttributeSpec(
    "otel_train.step.samples", "int", "{sample}", "Samples in the step (absent if unknown)."
)
STEP_TOKENS = AttributeSpec(
    "otel_train.step.tokens", "int", "{token}", "Tokens in the step (absent if unknown)."
)
RANK = AttributeSpec("otel_train.rank", "int", "", "Global rank of the process (RANK, else 0).")
STEP_HOST_DURATION = AttributeSpec(
    "otel_train.step.host_duration", "double", "s", "Host wall time from step start to step end."
)
STEP_DEVICE_DURATION = AttributeSpec(
    "otel_train.step.device_duration",
    "double",
    "s",
    "Device time from the step's first to its last CUDA event. Absent without CUDA.",
)
STEP_SAMPLED_BECAUSE = AttributeSpec(
    "otel_train.step.sampled_because",
    "string",
    "",
    "Why this step became a trace: all, slowest, error, first or debug (a profiled step "
    "or the end of a memory-snapshot window).",
)
STEP_THROUGHPUT_SAMPLES = AttributeSpec(
    "otel_train.step.throughput.samples", "double", "{sample}/s", "Samples / host step time."
)
STEP_THROUGHPUT_TOKENS = AttributeSpec(
    "otel_train.step.throughput.tokens", "double", "{token}/s", "Tokens / host step time."
)
STEP_FLOPS = AttributeSpec(
    "otel_train.step.flops",
    "double",
    "{flop}",
    "FLOPs of the step (matmul, convolution and attention FLOPs, forward and backward). "
    "Absent when unknown.",
)
STEP_FLOPS_SOURCE = AttributeSpec(
    "otel_train.step.flops.source",
    "string",
    "",
    "Where the step's FLOPs come from: counted (FlopCounterMode over a step of this batch "
    "shape), scaled (from the nearest counted shape, linear in tokens or samples), given "
    "(flops_per_step setting) or estimate (6 x trainable parameters x tokens).",
)
STEP_FLOPS_COUNTED = AttributeSpec(
    "otel_train.step.flops.counted",
    "boolean",
    "",
    "True on the step whose FLOPs were counted: it ran slower under the counter, so it "
    "has no FLOP rate or MFU. Absent on other steps.",
)
STEP_THROUGHPUT_FLOPS = AttributeSpec(
    "otel_train.step.throughput.flops",
    "double",
    "{flop}/s",
    "Achieved FLOP/s: step FLOPs / step time (device time with CUDA, host time otherwise).",
)
STEP_MFU = AttributeSpec(
    "otel_train.step.mfu",
    "double",
    "1",
    "Model FLOPs utilization: achieved FLOP/s / the device's dense peak for the matmul "
    "dtype. Absent when no peak is known (CPU without the peak_tflops setting).",
)
STEP_DATA_STALL = AttributeSpec(
    "otel_train.step.data_stall",
    "double",
    "1",
    "Share of the step's host wall time spent waiting for the batch (top-level data phases).",
)
PHASE_NAME = AttributeSpec("otel_train.phase.name", "string", "", "Phase name.")
PHASE_CLOCK = AttributeSpec(
    "otel_train.phase.clock",
    "string",
    "",
    "Clock of the span's start/end timestamps: device (CUDA events placed on the host "
    "clock) or host.",
)
PHASE_HOST_DURATION = AttributeSpec(
    "otel_train.phase.host_duration", "double", "s", "Host wall time between enter and exit."
)
PHASE_DEVICE_DURATION = AttributeSpec(
    "otel_train.phase.device_duration",
    "double",
    "s",
    "Time between the phase's start and end CUDA events on the stream current at the "
    "boundary. Absent without CUDA, never zero-filled.",
)
PHASE_PEAK_ALLOCATED = AttributeSpec(
    "otel_train.phase.memory.peak_allocated",
    "int",
    "By",
    "Peak bytes allocated by the CUDA caching allocator during the phase. Absent without CUDA.",
)
PHASE_PEAK_RESERVED = AttributeSpec(
    "otel_train.phase.memory.peak_reserved",
    "int",
    "By",
    "Peak bytes reserved by the CUDA caching allocator during the phase. Absent without CUDA.",
)
PHASE_PEAK_UTILIZATION = AttributeSpec(
    "otel_train.phase.memory.peak_utilization",
    "double",
    "1",
    "Peak reserved bytes / total device memory. Absent without CUDA.",
)
PHASE_ALLOC_RETRIES = AttributeSpec(
    "otel_train.phase.memory.alloc_retries",
    "int",
    "{retry}",
    "cudaMalloc retries (allocator cache flushes) during the phase. Absent without CUDA.",
)
PHASE_OOMS = AttributeSpec(
    "otel_train.phase.memory.ooms",
    "int",
    "{oom}",
    "Out-of-memory errors raised by the allocator during the phase. Absent without CUDA.",
)

RESOURCE_RANK = AttributeSpec(
    "otel_train.rank", "int", "", "Resource: global rank (RANK or SLURM_PROCID, else 0)."
)
RESOURCE_LOCAL_RANK = AttributeSpec(
    "otel_train.local_rank", "int", "", "Resource: rank on the node (LOCAL_RANK, SLURM_LOCALID)."
)
RESOURCE_WORLD_SIZE = AttributeSpec(
    "otel_train.world_size", "int", "", "Resource: number of ranks (WORLD_SIZE, SLURM_NTASKS)."
)
RESOURCE_JOB = AttributeSpec(
    "otel_train.job",
    "string",
    "",
    "Resource: job/run id (OTEL_TRAIN_RUN_ID, TORCHELASTIC_RUN_ID, SLURM_JOB_ID, K8S_JOB_NAME).",
)
RESOURCE_NODE_RANK = AttributeSpec(
    "otel_train.node_rank",
    "int",
    "",
    "Resource: index of the node (GROUP_RANK, SLURM_NODEID, JOB_COMPLETION_INDEX).",
)
RESOURCE_ATTRIBUTES = (
    AttributeSpec(
        "service.name", "string", "", "service_name setting, OTEL_SERVICE_NAME, else 'otel-train'."
    ),
    AttributeSpec(
        "service.instance.id",
        "string",
        "",
        "UUIDv5 of (job, rank) when the job id is known (stable across elastic restarts), "
        "else a random UUID per process; a forked child gets a new one.",
    ),
    AttributeSpec(
        "host.name", "string", "", "The node: K8S_NODE_NAME, SLURMD_NODENAME, else the hostname."
    ),
    RESOURCE_RANK,
    RESOURCE_LOCAL_RANK,
    RESOURCE_WORLD_SIZE,
    RESOURCE_NODE_RANK,
    RESOURCE_JOB,
    AttributeSpec("k8s.pod.name", "string", "", "K8S_POD_NAME (downward API), when set."),
    AttributeSpec("k8s.namespace.name", "string", "", "K8S_NAMESPACE_NAME, when set."),
    AttributeSpec("k8s.node.name", "string", "", "K8S_NODE_NAME (spec.nodeName), when set."),
    AttributeSpec("k8s.job.name", "string", "", "K8S_JOB_NAME, when set."),
)

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

STEP_SPAN = SpanSpec(
    "otel_train.step",
    "One training step (root of its own trace). Start: first host boundary; end: the later "
    "of host exit and the last device event.",
    (
        STEP_INDEX,
        STEP_SAMPLES,
        STEP_TOKENS,
        RANK,
        STEP_HOST_DURATION,
        STEP_DEVICE_DURATION,
        STEP_THROUGHPUT_SAMPLES,
        STEP_THROUGHPUT_TOKENS,
        STEP_FLOPS,
        STEP_FLOPS_SOURCE,
        STEP_FLOPS_COUNTED,
        STEP_THROUGHPUT_FLOPS,
        STEP_MFU,
        STEP_DATA_STALL,
        STEP_SAMPLED_BECAUSE,
    ),
)
PHASE_SPAN = SpanSpec(
    "<phase name>",
    "One phase (data, forward, backward, optimizer, rollout, ...), child of its step or of "
    "the enclosing phase. Named after the phase. Status ERROR and an `exception` event when "
    f"the phase raised; an `{OOM_EVENT}` event on a CUDA out-of-memory error.",
    (
        PHASE_NAME,
        STEP_INDEX,
        PHASE_CLOCK,
        PHASE_HOST_DURATION,
        PHASE_DEVICE_DURATION,
        PHASE_PEAK_ALLOCATED,
        PHASE_PEAK_RESERVED,
        PHASE_PEAK_UTILIZATION,
        PHASE_ALLOC_RETRIES,
        PHASE_OOMS,
    ),
)
SPANS = (STEP_SPAN, PHASE_SPAN)

# Phase names the adapters emit (user phases and method maps add their own names).
ADAPTER_PHASES = {
    "data": "Waiting for the next batch (host clock): DataLoader next(), HF get_batch_samples, "
    "the gap between Lightning batches, torchtitan next_batch.",
    "forward": "From the start of the model's forward until backward starts (the loss included).",
    "backward": "torch.autograd.backward (what loss.backward() calls).",
    "optimizer": "The optimizer step, from its pre-hook to its post-hook.",
    "microstep": "One gradient-accumulation micro-batch (forward and backward inside); HF and "
    "Lightning adapters, only when accumulating.",
    "forward_backward": "torchtitan-style forward_backward_step (backward nested inside).",
}

# --- metric attribute keys ---------------------------------------------------

A_PHASE = "phase"
A_CLOCK = "clock"
A_KIND = "kind"
A_NAME = "name"
A_REASON = "reason"
A_DTYPE = "dtype"
A_CATEGORY = "category"

METRIC_ATTRIBUTES = {
    A_PHASE: "Phase name (data, forward, backward, optimizer, rollout, ...).",
    A_CLOCK: "device when measured with CUDA events, host otherwise.",
    A_KIND: "allocated or reserved (CUDA caching allocator).",
    A_NAME: "User scalar name as given to otel_train.record().",
    A_REASON: "Why telemetry was dropped: queue_full (pending steps), late_phase (a phase that "
    "ended after its step had ended, or ran on another thread while no step was open), "
    "scalar_names (user scalars with a new name past the 256-name cap), sidecar (steps the "
    "training process could not hand to its sidecar process: pipe and buffer full, or the "
    "sidecar gone), export (spans whose "
    "OTLP export failed), span_queue (spans dropped because the export queue was full) or "
    "metric_export (metric data points whose OTLP export failed).",
    A_DTYPE: "Matmul dtype the peak is for: fp32, tf32, bf16, fp16 or fp8.",
    A_CATEGORY: "Where run wall time went: train (steps less data waits), data (waiting for "
    "batches inside steps), evaluation and checkpoint (marked regions), other (the rest).",
}

# --- metrics -----------------------------------------------------------------

STEP_DURATION = MetricSpec(
    "otel_train.step.duration", "histogram", "s", "Host wall time of each training step."
)
PHASE_DURATION = MetricSpec(
    "otel_train.phase.duration",
    "histogram",
    "s",
    "Duration of each phase: device time from CUDA events when available, host time otherwise.",
    (A_PHASE, A_CLOCK),
)
PHASE_MEMORY_PEAK = MetricSpec(
    "otel_train.phase.memory.peak",
    "gauge",
    "By",
    "Peak CUDA allocator bytes during the phase in the most recent step (CUDA only).",
    (A_PHASE, A_KIND),
)
PHASE_MEMORY_UTILIZATION = MetricSpec(
    "otel_train.phase.memory.utilization",
    "gauge",
    "1",
    "Peak reserved bytes during the phase / total device memory, most recent step (CUDA only).",
    (A_PHASE,),
)
DEVICE_MEMORY_LIMIT = MetricSpec(
    "otel_train.device.memory.limit", "gauge", "By", "Total memory of the training device (CUDA)."
)
PROCESS_MEMORY_RSS = MetricSpec(
    "otel_train.process.memory.rss", "gauge", "By", "Resident set size of the training process."
)
PROCESS_MEMORY_PEAK_RSS = MetricSpec(
    "otel_train.process.memory.peak_rss",
    "gauge",
    "By",
    "Peak resident set size of the training process.",
)
HOST_MEMORY_TOTAL = MetricSpec(
    "otel_train.host.memory.total",
    "gauge",
    "By",
    "Physical memory of the host (the limit process RSS is read against on CPU runs).",
)
THROUGHPUT_SAMPLES = MetricSpec(
    "otel_train.throughput.samples",
    "gauge",
    "{sample}/s",
    "Samples per second of wall time over the recent throughput window.",
)
THROUGHPUT_TOKENS = MetricSpec(
    "otel_train.throughput.tokens",
    "gauge",
    "{token}/s",
    "Tokens per second of wall time over the recent throughput window.",
)
THROUGHPUT_FLOPS = MetricSpec(
    "otel_train.throughput.flops",
    "gauge",
    "{flop}/s",
    "Achieved FLOP/s over the recent throughput window: step FLOPs / step time (device time "
    "with CUDA). The counted step is left out.",
)
MFU = MetricSpec(
    "otel_train.mfu",
    "gauge",
    "1",
    "Model FLOPs utilization over the recent throughput window: achieved FLOP/s / dense "
    "peak. Needs a known peak (a listed CUDA device, or the peak_tflops setting).",
)
DEVICE_PEAK_FLOPS = MetricSpec(
    "otel_train.device.peak_flops",
    "gauge",
    "{flop}/s",
    "Dense peak FLOP/s MFU is measured against (datasheet table, or the peak_tflops "
    "setting). Needs a known peak (a listed CUDA device, or the peak_tflops setting).",
    (A_DTYPE,),
)
FLOPS_PER_STEP = MetricSpec(
    "otel_train.flops.per_step",
    "gauge",
    "{flop}",
    "FLOPs of the most recent step (counted, scaled, given or estimated).",
)
FLOPS_COUNT_COST = MetricSpec(
    "otel_train.flops.count_cost",
    "gauge",
    "s",
    "Extra wall time the FLOP-counting step took: its duration less the median of the "
    "next five steps'.",
)
DATA_STALL = MetricSpec(
    "otel_train.data.stall",
    "gauge",
    "1",
    "Share of step wall time spent waiting for batches (data phases) over the recent "
    "throughput window.",
)
RUN_TIME = MetricSpec(
    "otel_train.run.time",
    "counter",
    "s",
    "Run wall time since the first step, by where it went.",
    (A_CATEGORY,),
)
GOODPUT = MetricSpec(
    "otel_train.goodput",
    "gauge",
    "1",
    "Share of run wall time (since the first step) spent training: steps less data waits.",
)
STEPS = MetricSpec("otel_train.steps", "counter", "{step}", "Training steps completed.")
SAMPLES = MetricSpec("otel_train.samples", "counter", "{sample}", "Samples processed.")
TOKENS = MetricSpec("otel_train.tokens", "counter", "{token}", "Tokens processed.")
SCALAR = MetricSpec(
    "otel_train.scalar",
    "gauge",
    "{value}",
    "Last value of a user scalar (loss, reward, ...) given to otel_train.record().",
    (A_NAME,),
)
PENDING_STEPS = MetricSpec(
    "otel_train.pending.steps",
    "gauge",
    "{step}",
    "Finished steps waiting for their CUDA events to resolve.",
)
DROPPED = MetricSpec(
    "otel_train.dropped",
    "counter",
    "{item}",
    "Telemetry dropped so that training is never blocked.",
    (A_REASON,),
)
SPANS_EMITTED = MetricSpec(
    "otel_train.spans.emitted", "counter", "{span}", "Spans handed to the tracer."
)
OVERHEAD = MetricSpec(
    "otel_train.overhead",
    "gauge",
    "s",
    "CPU time of otel-train's background worker per training step (recent average).",
)

METRICS = (
    STEP_DURATION,
    PHASE_DURATION,
    PHASE_MEMORY_PEAK,
    PHASE_MEMORY_UTILIZATION,
    DEVICE_MEMORY_LIMIT,
    PROCESS_MEMORY_RSS,
    PROCESS_MEMORY_PEAK_RSS,
    HOST_MEMORY_TOTAL,
    THROUGHPUT_SAMPLES,
    THROUGHPUT_TOKENS,
    THROUGHPUT_FLOPS,
    MFU,
    DEVICE_PEAK_FLOPS,
    FLOPS_PER_STEP,
    FLOPS_COUNT_COST,
    DATA_STALL,
    RUN_TIME,
    GOODPUT,
    STEPS,
    SAMPLES,
    TOKENS,
    SCALAR,
    PENDING_STEPS,
    DROPPED,
    SPANS_EMITTED,
    OVERHEAD,
)

# --- Prometheus name translation ---------------------------------------------

_UNIT_WORDS = {
    "s": "seconds",
    "ms": "milliseconds",
    "By": "bytes",
    "1": "",
    "%": "percent",
}
_PER_UNIT_WORDS = {"s": "second", "m": "minute", "h": "hour"}


def _unit_suffix(unit: str) -> str:
    unit = re.sub(r"\{[^}]*\}", "", unit)
    if "/" in unit:
        num, _, den = unit.partition("/")
        num_word = _UNIT_WORDS.get(num, num)
        den_word = _PER_UNIT_WORDS.get(den, den)
        return "_".join(p for p in (num_word, "per", den_word) if p) if den_word else num_word
    return _UNIT_WORDS.get(unit, unit)


def prometheus_base_name(spec: MetricSpec, source: str = "otlp") -> str:
    """The metric's Prometheus name (before the _bucket/_sum/_count series suffixes).

    ``source="otlp"``: as Prometheus's OTLP receiver names it (translation strategy
    UnderscoreEscapingWithSuffixes; what the dashboards query). ``source="scrape"``: as
    the in-process ``/metrics`` endpoint names it. They differ only for gauges of unit
    ``1``, which get a ``_ratio`` suffix over OTLP and none from the Python exporter.
    """
    if source not in ("otlp", "scrape"):
        raise ValueError("source must be 'otlp' or 'scrape'")
    name = re.sub(r"[^a-zA-Z0-9:]", "_", spec.name)
    suffix = _unit_suffix(spec.unit)
    if spec.unit == "1" and spec.instrument == "gauge" and source == "otlp":
        suffix = "ratio"
    if suffix and not name.endswith("_" + suffix):
        name = f"{name}_{suffix}"
    if spec.instrument == "counter":
        name += "_total"
    return name


def prometheus_names(spec: MetricSpec, source: str = "otlp") -> tuple[str, ...]:
    """Every series name a query of this metric can use."""
    base = prometheus_base_name(spec, source)
    if spec.instrument == "histogram":
        return (f"{base}_bucket", f"{base}_sum", f"{base}_count")
    return (base,)


# --- generated reference ---------------------------------------------------------------


def render_markdown() -> str:
    """The text of docs/telemetry.md."""
    out = [
        "# Telemetry reference",
        "",
        "Generated from `otel_train/contract.py` by `otel-train telemetry`; "
        "a test keeps this file identical to that output. Do not edit by hand.",
        "",
        f"Instrumentation scope: `{SCOPE_NAME}`. Units are UCUM.",
        "",
        "## Spans",
        "",
        "One trace per sampled training step: the step span is the root and phases are its "
        "children (nested phases nest).",
        "",
    ]
    for span in SPANS:
        out += [f"### `{span.name}`", "", span.description, ""]
        out += ["| attribute | type | unit | description |", "|---|---|---|---|"]
        for a in span.attributes:
            out.append(f"| `{a.key}` | {a.type} | `{a.unit or '-'}` | {a.description} |")
        out.append("")
    out += ["### Phase names from the adapters", "", "| phase | what it covers |", "|---|---|"]
    for name, what in ADAPTER_PHASES.items():
        out.append(f"| `{name}` | {what} |")
    for event, (where, attributes) in EVENTS.items():
        out += ["", f"### Event `{event}`", "", where, ""]
        out += ["| attribute | type | unit | description |", "|---|---|---|---|"]
        for a in attributes:
            out.append(f"| `{a.key}` | {a.type} | `{a.unit or '-'}` | {a.description} |")
    out += ["", "## Resource attributes", "", "Set when otel-train builds the SDK itself.", ""]
    out += ["| attribute | type | description |", "|---|---|---|"]
    for a in RESOURCE_ATTRIBUTES:
        out.append(f"| `{a.key}` | {a.type} | {a.description} |")
    out += [
        "",
        "## Metrics",
        "",
        "Prometheus names are those of Prometheus's OTLP receiver; the in-process `/metrics` "
        "endpoint names gauges of unit `1` without the `_ratio` suffix.",
        "",
        "| metric | instrument | unit | attributes | Prometheus | description |",
        "|---|---|---|---|---|---|",
    ]
    for m in METRICS:
        attrs = ", ".join(f"`{a}`" for a in m.attributes) or "-"
        prom = f"`{prometheus_base_name(m)}`"
        out.append(
            f"| `{m.name}` | {m.instrument} | `{m.unit}` | {attrs} | {prom} | {m.description} |"
        )
    out += ["", "Duration histogram bucket boundaries (seconds): "]
    out.append(", ".join(f"{b:g}" for b in DURATION_BUCKETS) + ".")
    out += ["", "## Metric attributes", "", "| attribute | meaning |", "|---|---|"]
    for key, meaning in METRIC_ATTRIBUTES.items():
        out.append(f"| `{key}` | {meaning} |")
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover - exercised by the docs test via subprocess
    print(render_markdown(), end="")
