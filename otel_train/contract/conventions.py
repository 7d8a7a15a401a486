"""Names the contract shares with others: the OpenTelemetry semantic conventions it
emits (and the names of its own they replaced), and what Megatron, NeMo Lens and the
``rl.*`` proposal call otel-train's figures.

Compared against semantic conventions :data:`SEMCONV_VERSION` (``service.*``,
``host.*``, ``process.*``, ``system.*``, ``k8s.*``, ``hw.*`` / ``hw.gpu.*``): where one
defines a figure otel-train emits, the contract uses its name, unit and instrument
(:data:`CONVENTIONS`; a test fails when such a figure is emitted under another name).
Training itself has no convention: its step, phase, throughput and MFU names stay
``otel_train.*``, mapped to the peers' names in :data:`PEER_NAMES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .metrics import A_HW_ID, DEVICE_MEMORY_LIMIT, HOST_MEMORY_TOTAL, PROCESS_MEMORY_RSS

SEMCONV_VERSION = "1.45.0"
# Namespaces the semantic conventions own: a contract name under one must be theirs.
SEMCONV_NAMESPACES = ("service.", "host.", "process.", "system.", "k8s.", "hw.", "telemetry.")


@dataclass(frozen=True)
class Convention:
    name: str
    signal: str  # "resource" | "metric" | "metric attribute"
    kind: str  # the metric's instrument, or the attribute's type
    unit: str
    replaces: tuple[str, ...] = ()  # names otel-train used for it before


CONVENTIONS = (
    Convention("service.name", "resource", "string", ""),
    Convention("service.instance.id", "resource", "string", ""),
    Convention("host.name", "resource", "string", ""),
    Convention("k8s.pod.name", "resource", "string", ""),
    Convention("k8s.namespace.name", "resource", "string", ""),
    Convention("k8s.node.name", "resource", "string", ""),
    Convention("k8s.job.name", "resource", "string", ""),
    Convention(PROCESS_MEMORY_RSS.name, "metric", "updowncounter", "By",
               ("otel_train.process.memory.rss",)),
    Convention(HOST_MEMORY_TOTAL.name, "metric", "updowncounter", "By",
               ("otel_train.host.memory.total",)),
    Convention(DEVICE_MEMORY_LIMIT.name, "metric", "updowncounter", "By",
               ("otel_train.device.memory.limit",)),
    Convention(A_HW_ID, "metric attribute", "string", ""),
)  # fmt: skip

_NONE = "-"
# (figure, otel-train, Megatron megatron.training.*, NeMo Lens dl.* / nv.dl.*, rl.* #88).
# Megatron and Lens: Megatron-LM docs/user-guide/observability/metrics.md and NeMo Lens
# semconv (attributes.py, docs/design/semconv.mdx); rl.*: semantic-conventions-genai #88,
# an open proposal, of which only the names given are settled in its text.
PEER_NAMES: tuple[tuple[str, str, str, str, str], ...] = (
    ("step", "`otel_train.step` span", "`megatron.train_step` span", _NONE, _NONE),
    ("step time", "`otel_train.step.duration` (histogram, s)",
     "`megatron.training.step_duration_ms` (histogram, ms)", _NONE,
     "`rl.loop.duration` (one RL iteration)"),
    ("step index", "`otel_train.step.index` (span)", "`megatron.iteration` (span)",
     "`dl.iteration`", _NONE),
    ("phase time", "`otel_train.phase.duration{phase}` (histogram, s) and phase spans",
     "spans `megatron.forward_backward`, `megatron.microbatch.forward` / `.backward`, "
     "`megatron.optimizer_step`", _NONE,
     "`rl.sample.*`, `rl.train.*`, `rl.sync.*` groups (rollout, train, weight sync)"),
    ("tokens per second", "rate of `otel_train.tokens` (PromQL, docs above)",
     "`megatron.training.tokens_per_sec` (gauge)", "`dl.throughput_tokens_per_sec`",
     _NONE),
    ("samples per second", "rate of `otel_train.samples`", _NONE, _NONE, _NONE),
    ("achieved FLOP/s", "`otel_train.throughput.flops` ({flop}/s)",
     "`megatron.training.throughput_tflops` (TFLOP/s per GPU)", "`dl.throughput_tflops`",
     _NONE),
    ("MFU", "`otel_train.mfu{dtype}` (1)", _NONE, _NONE, _NONE),
    ("peak memory", "`otel_train.phase.memory.peak{phase, kind}` (By)",
     "`megatron.training.memory_allocated_gb` (gauge, GB, whole interval)", _NONE, _NONE),
    ("device memory", f"`{DEVICE_MEMORY_LIMIT.name}` (By)", _NONE,
     "`nv.gpu.memory_total`", _NONE),
    ("loss", '`otel_train.scalar{name="loss"}`', "`megatron.training.loss`", "`dl.loss`",
     _NONE),
    ("rank", "`otel_train.rank`", _NONE, "`nv.dl.rank`", _NONE),
    ("world size", "`otel_train.world_size`", _NONE, "`nv.dl.world_size`", _NONE),
    ("run", "`otel_train.job`", "`nemo.run.id` (resource)", "`nv.dl.run.uuid`",
     "`rl.run.id` (resource)"),
)  # fmt: skip
