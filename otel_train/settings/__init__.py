"""Settings: one frozen dataclass, resolved once at ``instrument()``/``configure()`` time.

Precedence: keyword argument > ``OTEL_TRAIN_<NAME>`` environment variable > default.
Standard ``OTEL_*`` variables keep their standard meaning and are read by the SDK
and exporters themselves (endpoint, headers, protocol, service name, ...).

A bad value raises :class:`ConfigError` naming the setting, where it came from and
the accepted values; nothing is silently ignored.

Usage::

    settings = Settings.resolve({"console_every": 50})

How each value is checked and parsed: :mod:`.values`.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import values as v
from .values import ConfigError

__all__ = ["DEFAULT_SERVICE_NAME", "ENV_PREFIX", "ConfigError", "Settings", "settings_table"]

ENV_PREFIX = "OTEL_TRAIN_"
DEFAULT_SERVICE_NAME = "otel-train"


@dataclass(frozen=True)
class Settings:
    """Everything otel-train can be told. Field docs double as docs/configuration.md's table."""

    service_name: str | None = field(
        default=None,
        metadata={
            "parse": v.optional_str,
            "doc": "service.name; default OTEL_SERVICE_NAME, else service.name in "
            "OTEL_RESOURCE_ATTRIBUTES, else default_service_name.",
        },
    )
    default_service_name: str = field(
        default=DEFAULT_SERVICE_NAME,
        metadata={
            "parse": v.identifier,
            "doc": "service.name when neither service_name nor the standard variables name "
            "one: a script's own name that OTEL_SERVICE_NAME overrides.",
        },
    )
    role: str | None = field(
        default=None,
        metadata={
            "parse": v.optional_str,
            "doc": "This process's part in the job (trainer, generator, ...): resource "
            "attribute otel_train.role, so its metrics and spans say which side they are.",
        },
    )
    otlp_endpoint: str | None = field(
        default=None,
        metadata={
            "parse": v.endpoint,
            "doc": "OTLP base URL. Default: the standard "
            "OTEL_EXPORTER_OTLP_ENDPOINT / _TRACES_ / _METRICS_ variables; none = no OTLP.",
        },
    )
    otlp_protocol: str = field(
        default="http/protobuf",
        metadata={
            "parse": v.choice("http/protobuf", "grpc"),
            "std_env": "OTEL_EXPORTER_OTLP_PROTOCOL",
            "doc": "http/protobuf (fork-safe) or grpc.",
        },
    )
    prometheus: bool = field(
        default=True,
        metadata={"parse": v.boolean, "doc": "Serve /metrics when otel-train configures the SDK."},
    )
    prometheus_host: str = field(
        default="127.0.0.1",
        metadata={
            "parse": v.host,
            "std_env": "OTEL_EXPORTER_PROMETHEUS_HOST",
            "doc": "Interface /metrics binds to (loopback unless you opt in).",
        },
    )
    prometheus_port: int = field(
        default=9464,
        metadata={
            "parse": v.int_range(0, 65535),
            "std_env": "OTEL_EXPORTER_PROMETHEUS_PORT",
            "doc": "Port of /metrics (0 = any free port).",
        },
    )
    prometheus_ranks: str = field(
        default="offset",
        metadata={
            "parse": v.choice("offset", "first", "all"),
            "doc": "/metrics with several ranks on a node: offset (port + LOCAL_RANK), "
            "first (local rank 0 only), all (every rank binds the same port: a clash errors).",
        },
    )
    metric_export_interval: float = field(
        default=10.0,
        metadata={
            "parse": v.float_range(0.1, 3600.0),
            "doc": "Seconds between OTLP metric "
            "exports (OTEL_METRIC_EXPORT_INTERVAL, in ms, is honoured when set).",
        },
    )
    console_every: int = field(
        default=100,
        metadata={
            "parse": v.int_range(0, 10**9),
            "doc": "Print the per-step phase table every "
            "N steps; 0 = never. The run summary prints at shutdown unless console is off.",
        },
    )
    console: str = field(
        default="stderr",
        metadata={
            "parse": v.choice("stderr", "stdout", "off"),
            "doc": "Where tables go: stderr, stdout, off (no tables, no summary).",
        },
    )
    console_ranks: str = field(
        default="first",
        metadata={
            "parse": v.choice("first", "all"),
            "doc": "With several ranks: first (global rank 0 alone prints tables and the "
            "summary), all (every rank prints, each table and summary naming its rank).",
        },
    )
    trace_steps: str = field(
        default="sampled",
        metadata={
            "parse": v.choice("sampled", "all", "none"),
            "doc": "Which steps become "
            "traces: sampled (the slowest of each window, errors, the first step of each "
            "instrumentation and of each new step shape), all, none.",
        },
    )
    trace_window: int = field(
        default=1000,
        metadata={"parse": v.int_range(1, 10**7), "doc": "Steps per sampling window."},
    )
    trace_window_seconds: float = field(
        default=60.0,
        metadata={
            "parse": v.float_range(0.01, 86400.0),
            "doc": "A sampling window also closes after this many seconds.",
        },
    )
    trace_slowest: int = field(
        default=1,
        metadata={"parse": v.int_range(0, 1000), "doc": "Slowest steps traced per window."},
    )
    hang_after: float | str = field(
        default="auto",
        metadata={
            "parse": v.seconds_or("auto", "off", lo=1.0, hi=7 * 86400.0),
            "doc": "Seconds without progress (no phase boundary on the training thread) "
            "after which a rank reports a hang (an otel_train.hang log record with every "
            "thread's stack, a console line, the progress gauges); auto: 300, and 1800 until "
            "the first step ended (compilation, autotuning); off: no watch. An open "
            "evaluation or checkpoint region may last 10x as long.",
        },
    )
    device_timing: str = field(
        default="auto",
        metadata={
            "parse": v.choice("auto", "cuda", "off"),
            "doc": "CUDA event timing: auto (when CUDA is available), cuda (required), off.",
        },
    )
    memory: bool = field(
        default=True,
        metadata={"parse": v.boolean, "doc": "Per-phase CUDA allocator peaks."},
    )
    reset_peak_memory: bool = field(
        default=True,
        metadata={
            "parse": v.boolean,
            "doc": "Reset the allocator's peak statistics at phase "
            "boundaries (exact per-phase peaks). Off: peaks are since the last reset "
            "anyone made (upper bounds), and your own resets are never disturbed.",
        },
    )
    max_pending_steps: int = field(
        default=1024,
        metadata={
            "parse": v.int_range(1, 10**6),
            "doc": "Finished steps held while their "
            "CUDA events resolve; beyond it the oldest is dropped and counted.",
        },
    )
    shutdown_timeout: float = field(
        default=5.0,
        metadata={
            "parse": v.float_range(0.0, 600.0),
            "doc": "Seconds shutdown() may take, flush included, even with the collector down.",
        },
    )
    sidecar: str = field(
        default="auto",
        metadata={
            "parse": v.choice("auto", "off"),
            "doc": "Where metrics, tables, spans and exports are computed: auto (a sidecar "
            "process beside each training process when otel-train configures the SDK, so "
            "the training thread never waits for them, also serving SDK providers you pass; "
            "a thread for providers that are not the SDK's), off (always a thread).",
        },
    )
    flush_on_sigterm: bool = field(
        default=True,
        metadata={
            "parse": v.boolean,
            "doc": "On SIGTERM with no handler of yours installed: shutdown() (flush, within "
            "shutdown_timeout), then die by SIGTERM as before. Your own handler is called instead.",
        },
    )
    batch_dim: int = field(
        default=0,
        metadata={
            "parse": v.int_range(0, 1),
            "doc": "Dimension of a batch's first tensor that counts its samples: 0 (batch "
            "first), or 1 for sequence-first batches such as (seq_len, batch) (not used "
            "with count_batch=).",
        },
    )
    throughput_window: int = field(
        default=20,
        metadata={
            "parse": v.int_range(2, 10**6),
            "doc": "Steps in the window of the achieved FLOP/s and MFU gauges.",
        },
    )
    profile_steps: tuple[int, int] | None = field(
        default=None,
        metadata={
            "parse": v.step_range,
            "doc": "Run torch.profiler over these steps (e.g. '10-12', at most 1000 steps); "
            "the trace goes to debug_dir and each covered step span gets an "
            "otel_train.profile event with its path.",
        },
    )
    memory_snapshot: str = field(
        default="off",
        metadata={
            "parse": v.snapshot_mode,
            "doc": "CUDA allocator history: 'oom' (armed; on OutOfMemoryError the snapshot "
            "is dumped to debug_dir and linked from the failing phase span), a step range "
            "'10-12' (dumped when the range ends), or 'off'. Needs CUDA.",
        },
    )
    run_dir: str = field(
        default="otel-train-runs",
        metadata={
            "parse": v.run_directory,
            "doc": "Where the run record goes when otel-train configures the SDK itself: "
            "each run writes its spans and metrics as OTLP JSON Lines into "
            "<run_dir>/<service>-<run id or start time>/, one file set per rank; "
            "'off' writes none.",
        },
    )
    run_record_mb: int = field(
        default=256,
        metadata={
            "parse": v.int_range(1, 10**6),
            "doc": "Size cap of each process's run record files, in MiB: past it the oldest "
            "part of each file is rotated away (drops are counted).",
        },
    )
    debug_dir: str = field(
        default="otel-train-debug",
        metadata={
            "parse": v.directory,
            "doc": "Directory for profiler traces and memory snapshots.",
        },
    )

    flops: str = field(
        default="count",
        metadata={
            "parse": v.choice("count", "estimate", "off"),
            "doc": "FLOPs per step for MFU: count (FlopCounterMode over one step per batch "
            "size; that step runs slower), estimate (6 x trainable parameters x tokens, "
            "decoder-only transformers), off.",
        },
    )
    flops_per_step: float | None = field(
        default=None,
        metadata={
            "parse": v.optional_float(0.0, 1e24),
            "doc": "FLOPs of one training step, if you know them (replaces counting).",
        },
    )
    flops_count_step: int = field(
        default=1,
        metadata={
            "parse": v.int_range(0, 10**9),
            "doc": "Index of the step whose FLOPs are counted (1 = the second, after warm-up).",
        },
    )
    peak_tflops: float | None = field(
        default=None,
        metadata={
            "parse": v.optional_float(1e-6, 1e7),
            "doc": "Dense peak TFLOP/s of one device for MFU; default: the datasheet table "
            "by device name (CUDA). Without it a CPU run has no MFU.",
        },
    )
    peak_dtype: str = field(
        default="auto",
        metadata={
            "parse": v.choice("auto", "fp32", "tf32", "bf16", "fp16", "fp8"),
            "doc": "Dtype whose peak MFU uses; auto: the precision holding most of the "
            "counted step's FLOPs (float32 per PyTorch's fp32_precision settings: cuDNN's "
            "for convolutions); without a count, autocast's as the adapter saw it, else "
            "the parameters'; no MFU when unknown or mixed.",
        },
    )

    @classmethod
    def resolve(
        cls, overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> Settings:
        """Build settings from keyword overrides, then OTEL_TRAIN_* variables, then defaults."""
        env = os.environ if environ is None else environ
        overrides = dict(overrides or {})
        known = {f.name: f for f in dataclasses.fields(cls)}
        warn_unknown_env(env, known)
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown otel_train setting(s) {', '.join(unknown)}; accepted: "
                f"{', '.join(sorted(known))}"
            )
        values: dict[str, Any] = {}
        for name, f in known.items():
            parse = f.metadata["parse"]
            env_name = ENV_PREFIX + name.upper()
            std_env = f.metadata.get("std_env")
            if name in overrides:
                raw, source = overrides[name], f"argument {name}="
            elif env_name in env:
                raw, source = env[env_name], f"environment variable {env_name}"
            elif std_env and std_env in env:
                raw, source = env[std_env], f"environment variable {std_env}"
            else:
                continue
            try:
                values[name] = parse(name, raw)
            except ConfigError as err:
                raise ConfigError(
                    f"otel_train setting '{name}' (from {source}) {err}; got {v.shown(raw)}"
                ) from None
        if "metric_export_interval" not in values and "OTEL_METRIC_EXPORT_INTERVAL" in env:
            raw = env["OTEL_METRIC_EXPORT_INTERVAL"]
            try:
                values["metric_export_interval"] = (
                    v.float_range(100.0, 3_600_000.0)("metric_export_interval", raw) / 1000.0
                )
            except ConfigError as err:
                raise ConfigError(
                    "otel_train setting 'metric_export_interval' (from environment variable "
                    f"OTEL_METRIC_EXPORT_INTERVAL, milliseconds) {err}; got {v.shown(raw)}"
                ) from None
        return cls(**values)

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(Settings))


# OTEL_TRAIN_* names that are no setting: the run id (identity.py), the sidecar's own
# (set by its parent), and those of the project's tools (scripts/stack, deploy/compose.yaml's
# BIND, the benchmarks, the test switches) which a job may inherit from the shell.
OTHER_ENV = ("RUN_ID", "BIND")
OTHER_ENV_PREFIXES = ("SIDECAR_", "STACK_", "BENCH_")
OTHER_ENV_SUFFIXES = ("_REQUIRED", "SCREENSHOT")
_warned_env: set[str] = set()


def warn_unknown_env(env: Mapping[str, str], known: Mapping[str, Any]) -> None:
    """One warning per OTEL_TRAIN_* variable that names no setting (a misspelling would
    otherwise be ignored), naming the closest setting's variable. The verdicts'
    thresholds (verdicts.py) are settings too."""
    from .verdicts import VerdictSettings

    names = [*known, *(f.name for f in dataclasses.fields(VerdictSettings))]
    settings = [ENV_PREFIX + name.upper() for name in names]
    for name in env:
        rest = name[len(ENV_PREFIX) :]
        if (
            not name.startswith(ENV_PREFIX)
            or name in settings
            or name in _warned_env
            or rest in OTHER_ENV
            or rest.startswith(OTHER_ENV_PREFIXES)
            or rest.endswith(OTHER_ENV_SUFFIXES)
        ):
            continue
        _warned_env.add(name)
        close = difflib.get_close_matches(rest.lower(), names, n=1, cutoff=0.6)
        hint = f"did you mean {ENV_PREFIX}{close[0].upper()}?" if close else "see the settings"
        logging.getLogger("otel_train").warning(
            "otel-train: environment variable %s is no otel-train setting and is ignored; %s",
            name,
            hint,
        )


def settings_table() -> str:
    """Markdown table of every setting (docs/configuration.md)."""
    rows = ["| setting | environment | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(Settings):
        env = f"`{ENV_PREFIX}{f.name.upper()}`"
        if f.metadata.get("std_env"):
            env += f", `{f.metadata['std_env']}`"
        rows.append(f"| `{f.name}` | {env} | `{f.default!r}` | {f.metadata['doc']} |")
    return "\n".join(rows)
