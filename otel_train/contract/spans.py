"""Spans of the telemetry contract: the step span (root of its trace), the phase span,
and the phase names the adapters emit."""

from __future__ import annotations

from .attributes import (
    COLLECTIVE_GROUP,
    COLLECTIVE_OP,
    LINK_STALENESS,
    PHASE_ALLOC_RETRIES,
    PHASE_CLOCK,
    PHASE_COLLECTIVE_WAIT,
    PHASE_DEVICE_DURATION,
    PHASE_HOST_DURATION,
    PHASE_NAME,
    PHASE_OOMS,
    PHASE_PEAK_ALLOCATED,
    PHASE_PEAK_RESERVED,
    PHASE_PEAK_UTILIZATION,
    POLICY_VERSION,
    RANK,
    STEP_COLLECTIVE_WAIT,
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
from .events import OOM_EVENT
from .specs import SpanSpec

# --- spans -------------------------------------------------------------------------

STEP_SPAN = SpanSpec(
    "otel_train.step",
    "One training step (root of its own trace, or a child of another process's step "
    "with step(parent=carrier)). Start: first host boundary; end: the later "
    "of host exit and the last device event. A step that called otel_train.consumed(token) "
    "has a span link to each consumed rollout's span whose carrier was sampled (at most "
    "128).",
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
        STEP_COLLECTIVE_WAIT,
        STEP_SAMPLED_BECAUSE,
    ),
    links=(PHASE_NAME, POLICY_VERSION, LINK_STALENESS, PHASE_HOST_DURATION),
)
PHASE_SPAN = SpanSpec(
    "<phase name>",
    "One phase (data, forward, backward, optimizer, rollout, ...), child of its step or of "
    "the enclosing phase. Named after the phase. Status ERROR and an `exception` event when "
    f"the phase raised; an `{OOM_EVENT}` event on a CUDA out-of-memory error. A remote "
    "phase (phase(name, parent=carrier) in another process) is a child of the trainer's "
    "step span, in its trace, with its own process's resource, exported only when the "
    "carrier is sampled; its otel_train.step.index is the trainer's step. A blocking "
    "collective the training thread waited in for 1 ms or more is a phase span of its own, "
    "named after the op (all_reduce, ...) with otel_train.collective.op and "
    "otel_train.collective.group; shorter ones are only their phase's "
    "otel_train.phase.collective_wait.",
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
        PHASE_COLLECTIVE_WAIT,
        COLLECTIVE_OP,
        COLLECTIVE_GROUP,
        POLICY_VERSION,
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
