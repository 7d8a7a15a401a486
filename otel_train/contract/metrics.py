"""Metrics of the telemetry contract: every instrument with its kind, unit and
description, the attribute keys their data points carry, and the duration histogram
buckets."""

from __future__ import annotations

from .specs import MetricSpec

# Seconds. Covers sub-millisecond CPU phases to multi-minute RL rollouts.
DURATION_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 600.0,
)  # fmt: skip
# Over OTLP the same histograms are base-2 exponential ones (processing/exponential.py): at
# most this scale (buckets grow by 2 ** 2 ** -3 = 1.09x, Prometheus client libraries'
# default factor of 1.1) and this many buckets (the SDK's default max_size).
DURATION_MAX_SCALE = 3
DURATION_MAX_SIZE = 160

# Policy versions behind: a rollout consumed by the step it was made for is 0.
STALENESS_BUCKETS: tuple[float, ...] = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)

# --- metric attribute keys ---------------------------------------------------

A_PHASE = "phase"
A_CLOCK = "clock"
A_KIND = "kind"
A_NAME = "name"
A_REASON = "reason"
A_DTYPE = "dtype"
A_CATEGORY = "category"
A_HW_ID = "hw.id"  # the semantic conventions' hardware id (conventions.py)
A_COLLECTIVE_OP = "otel_train.collective.op"
A_COLLECTIVE_GROUP = "otel_train.collective.group"

METRIC_ATTRIBUTES = {
    A_PHASE: "Phase name (data, forward, backward, optimizer, rollout, ...).",
    A_CLOCK: "device when measured with CUDA events, host otherwise.",
    A_KIND: "allocated or reserved (CUDA caching allocator).",
    A_NAME: "User scalar name as given to otel_train.record().",
    A_REASON: "Why telemetry was dropped: queue_full (pending steps), late_phase (a phase of the "
    "training thread that ended after its step had ended, or a background thread's phase "
    "that no step had taken by shutdown), "
    "scalar_names (user scalars with a new name past the 256-name cap), sidecar (steps the "
    "training process could not hand to its sidecar process: pipe and buffer full, or the "
    "sidecar gone; or steps the sidecar received and could not keep: its backlog full), "
    "shutdown (steps the consumer had not processed when the shutdown deadline's drain "
    "time ran out: counted, not processed), "
    "export (spans whose "
    "OTLP export failed), span_queue (spans dropped because the export queue was full), "
    "metric_export (metric data points whose OTLP export failed) or run_record (spans and "
    "metric points the run record could not write: a full disk, its span queue full).",
    A_DTYPE: "Matmul dtype the MFU peak is for: fp32, tf32, bf16, fp16 or fp8.",
    A_CATEGORY: "Where run wall time went: train (steps less data waits), data (waiting for "
    "batches inside steps), evaluation and checkpoint (marked regions), hang (stalls: no "
    "progress for hang_after seconds, until progress resumed), other (the rest).",
    A_COLLECTIVE_OP: "The collective as torch.distributed names it (all_reduce, barrier, "
    "...; ddp_all_reduce: DDP's gradient all-reduce inside backward).",
    A_COLLECTIVE_GROUP: "The process group's name (default_pg for the default group).",
    A_HW_ID: "The GPU (semantic conventions `hw.id`): its UUID as NVML and DCGM name it "
    "(`GPU-...`, DCGM's `UUID` label), else `cuda:<index>`.",
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
DEVICE_MEMORY_LIMIT = MetricSpec(
    "hw.gpu.memory.limit",
    "updowncounter",
    "By",
    "Size of the training device's memory (CUDA; semantic conventions hw.gpu.memory.limit).",
    (A_HW_ID,),
)
PROCESS_MEMORY_RSS = MetricSpec(
    "process.memory.usage",
    "updowncounter",
    "By",
    "Resident set size of the training process (semantic conventions process.memory.usage).",
)
PROCESS_MEMORY_PEAK_RSS = MetricSpec(
    "otel_train.process.memory.peak_rss",
    "gauge",
    "By",
    "Peak resident set size of the training process.",
)
HOST_MEMORY_TOTAL = MetricSpec(
    "system.memory.limit",
    "updowncounter",
    "By",
    "Physical memory of the host, the limit process RSS is read against on CPU runs "
    "(semantic conventions system.memory.limit).",
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
    "Model FLOPs utilization over the recent throughput window: achieved FLOP/s / the "
    "device's dense peak for the matmul dtype (datasheet table, or the peak_tflops "
    "setting). Absent where no peak is known.",
    (A_DTYPE,),
)
RUN_TIME = MetricSpec(
    "otel_train.run.time",
    "counter",
    "s",
    "Run wall time since the first step, by where it went. A category's series starts "
    "with its first second: evaluation and checkpoint appear once such a region ended.",
    (A_CATEGORY,),
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
    "Telemetry dropped so that training is never blocked. A reason's series starts with "
    "its first drop: a run that drops nothing has none.",
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

POLICY_STALENESS = MetricSpec(
    "otel_train.policy.staleness",
    "histogram",
    "{version}",
    "Policy versions between a rollout's making and its use: j - k for a rollout made "
    "under version k and given to otel_train.consumed(token, policy_version=j) (RL).",
    buckets=STALENESS_BUCKETS,
)

COLLECTIVE_DURATION = MetricSpec(
    "otel_train.collective.duration",
    "histogram",
    "s",
    "Time the training thread spent in each blocking collective, waiting for its peers "
    "included (host time; on CUDA the device time of the stream current at the call).",
    (A_COLLECTIVE_OP, A_COLLECTIVE_GROUP),
)
PROGRESS_AGE = MetricSpec(
    "otel_train.progress.age",
    "gauge",
    "s",
    "Seconds since the training thread's last phase boundary, read at each export: it keeps "
    "rising while the training thread is stuck (alert OtelTrainRankStalled).",
)
PROGRESS_LIMIT = MetricSpec(
    "otel_train.progress.limit",
    "gauge",
    "s",
    "The progress age past which this rank counts as hung: hang_after, or the budget of the "
    "evaluation or checkpoint region open now. Absent when hang_after is off.",
)
COLLECTIVE_WAITING = MetricSpec(
    "otel_train.collective.waiting",
    "gauge",
    "1",
    "1 while the training thread is inside a collective (explicit, or DDP's gradient "
    "all-reduce at the end of backward), else 0: a stalled rank at 0 whose peers are stalled "
    "at 1 holds the job.",
)
TORCH_COMPILED = MetricSpec(
    "otel_train.torch.compiled",
    "gauge",
    "1",
    "1 once a model of this process ran under torch.compile, else 0 (the run fact "
    "otel_train.torch.compile, for a job read from a live stack).",
)

METRICS = (
    STEP_DURATION,
    PHASE_DURATION,
    PHASE_MEMORY_PEAK,
    DEVICE_MEMORY_LIMIT,
    PROCESS_MEMORY_RSS,
    PROCESS_MEMORY_PEAK_RSS,
    HOST_MEMORY_TOTAL,
    THROUGHPUT_FLOPS,
    MFU,
    RUN_TIME,
    STEPS,
    SAMPLES,
    TOKENS,
    SCALAR,
    PENDING_STEPS,
    DROPPED,
    SPANS_EMITTED,
    OVERHEAD,
    POLICY_STALENESS,
    COLLECTIVE_DURATION,
    PROGRESS_AGE,
    PROGRESS_LIMIT,
    COLLECTIVE_WAITING,
    TORCH_COMPILED,
)
