"""Span and resource attributes of the telemetry contract: the step span's, the phase
span's, and the resource attributes set when otel-train builds the SDK itself. Which
span carries which is in :mod:`.spans`."""

from __future__ import annotations

from .specs import AttributeSpec

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
    "Why this step became a trace: all, slowest, error, first (the first step of each "
    "instrumentation), shape (the first step of a step shape not seen before), debug (a "
    "profiled step or the end of a memory-snapshot window), carrier (it handed out a "
    "sampled otel_train.carrier(): other processes' spans are in its trace), parent (a "
    "step(parent=carrier) under a sampled carrier: a child of the other process's step), "
    "consumed (it consumed a rollout whose span was sampled: its link has a target) or "
    "hang (it was open when the rank hung: the otel_train.hang record names its ids).",
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
    "size), scaled (from the nearest counted size, linear in tokens or samples), given "
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
POLICY_VERSION = AttributeSpec(
    "otel_train.policy_version",
    "int",
    "",
    "On a remote phase's span (phase(name, parent=carrier)): the policy version the "
    "trainer passed to otel_train.carrier(policy_version=...). Absent when not given.",
)
LINK_STALENESS = AttributeSpec(
    "otel_train.policy.staleness",
    "int",
    "{version}",
    "On a step span's link to a consumed rollout: the consuming step's policy version less "
    "the rollout's (j - k). Absent when either is unknown.",
)
PHASE_COLLECTIVE_WAIT = AttributeSpec(
    "otel_train.phase.collective_wait",
    "double",
    "s",
    "Time the phase spent waiting in blocking collectives of the training thread (its own "
    "work is the rest): explicit torch.distributed calls, and in backward DDP's gradient "
    "all-reduce after the last gradient was ready. Host time; absent when none ran.",
)
STEP_COLLECTIVE_WAIT = AttributeSpec(
    "otel_train.step.collective_wait",
    "double",
    "s",
    "Time the step's phases spent waiting in collectives (otel_train.phase.collective_wait "
    "summed over its top-level phases). Absent when none ran.",
)
COLLECTIVE_OP = AttributeSpec(
    "otel_train.collective.op",
    "string",
    "",
    "The collective as torch.distributed names it (all_reduce, all_gather, "
    "reduce_scatter_tensor, broadcast, barrier, ...); ddp_all_reduce for DDP's gradient "
    "buckets.",
)
COLLECTIVE_GROUP = AttributeSpec(
    "otel_train.collective.group",
    "string",
    "",
    "The process group's name (default_pg for the default group).",
)
COLLECTIVE_SEQ = AttributeSpec(
    "otel_train.collective.seq",
    "int",
    "",
    "Collectives this rank entered on the group so far through torch.distributed, this "
    "one included: ranks stuck at different numbers did not call the same collective.",
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
RESOURCE_CONSUMER = AttributeSpec(
    "otel_train.consumer",
    "string",
    "",
    "Resource of otel-train's own SDK: where this process's steps are consumed (metrics, "
    "spans, console): sidecar (a process of its own) or thread (a thread of the training "
    'process: sidecar="off", or a sidecar that could not start).',
)
RESOURCE_ROLE = AttributeSpec(
    "otel_train.role",
    "string",
    "",
    "Resource: the process's part in the job, from the role setting (trainer, generator, "
    "...). Absent when not set.",
)
RUN_TORCH_VERSION = AttributeSpec(
    "otel_train.torch.version", "string", "", "torch's version in the training process."
)
RUN_TORCH_COMPILE = AttributeSpec(
    "otel_train.torch.compile",
    "boolean",
    "",
    "Whether a model ran under torch.compile: a compiled module given to instrument(), a "
    "compiled forward an adapter saw, or a graph Dynamo compiled during the run.",
)
RUN_VERSION = AttributeSpec("otel_train.version", "string", "", "otel-train's version.")
RUN_SETTINGS = AttributeSpec(
    "otel_train.settings",
    "string",
    "",
    "The settings that differ from their defaults, as name=value pairs joined by ', ' "
    "(where the telemetry goes left out: endpoints, host, port, directories, names).",
)
RUN_FACTS = (RUN_TORCH_VERSION, RUN_TORCH_COMPILE, RUN_VERSION, RUN_SETTINGS)
# The run facts known when the process starts: resource attributes of otel-train's own SDK
# too (the compile state is known later: metrics.TORCH_COMPILED).
START_FACTS = (RUN_TORCH_VERSION, RUN_VERSION, RUN_SETTINGS)
RESOURCE_ATTRIBUTES = (
    AttributeSpec(
        "service.name",
        "string",
        "",
        "service_name setting, OTEL_SERVICE_NAME, service.name in OTEL_RESOURCE_ATTRIBUTES, "
        "else the default_service_name setting ('otel-train').",
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
    RESOURCE_ROLE,
    RESOURCE_CONSUMER,
    *START_FACTS,
    AttributeSpec("k8s.pod.name", "string", "", "K8S_POD_NAME (downward API), when set."),
    AttributeSpec("k8s.namespace.name", "string", "", "K8S_NAMESPACE_NAME, when set."),
    AttributeSpec("k8s.node.name", "string", "", "K8S_NODE_NAME (spec.nodeName), when set."),
    AttributeSpec("k8s.job.name", "string", "", "K8S_JOB_NAME, when set."),
)
