"""Settings: one frozen dataclass, resolved once at ``instrument()``/``configure()`` time.

Precedence: keyword argument > ``OTEL_TRAIN_<NAME>`` environment variable > default.
Standard ``OTEL_*`` variables keep their standard meaning and are read by the SDK
and exporters themselves (endpoint, headers, protocol, service name, ...).

A bad value raises :class:`ConfigError` naming the setting, where it came from and
the accepted values; nothing is silently ignored.

Usage::

    settings = Settings.resolve({"console_every": 50})
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ENV_PREFIX = "OTEL_TRAIN_"
DEFAULT_SERVICE_NAME = "otel-train"


class ConfigError(ValueError):
    """A setting has a value otel-train does not accept."""


def _choice(*allowed: str) -> Callable[[str, Any], str]:
    def parse(name: str, value: Any) -> str:
        text = value.strip().lower() if isinstance(value, str) else None
        if text not in allowed:
            raise ConfigError(f"must be one of {', '.join(repr(a) for a in allowed)}")
        return str(text)

    return parse


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
    raise ConfigError("must be a boolean (true/false, 1/0, yes/no, on/off)")


def _int_range(lo: int, hi: int) -> Callable[[str, Any], int]:
    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
            raise ConfigError(f"must be an integer from {lo} to {hi}")
        try:
            number = int(value.strip()) if isinstance(value, str) else int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"must be an integer from {lo} to {hi}") from None
        if isinstance(value, float) and value != number:
            raise ConfigError(f"must be an integer from {lo} to {hi}")
        if not lo <= number <= hi:
            raise ConfigError(f"must be an integer from {lo} to {hi}")
        return number

    return parse


def _float_range(lo: float, hi: float) -> Callable[[str, Any], float]:
    def parse(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
            raise ConfigError(f"must be a number from {lo:g} to {hi:g}")
        try:
            number = float(value.strip()) if isinstance(value, str) else float(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"must be a number from {lo:g} to {hi:g}") from None
        if not lo <= number <= hi:  # also rejects NaN
            raise ConfigError(f"must be a number from {lo:g} to {hi:g}")
        return number

    return parse


def _optional_float(lo: float, hi: float) -> Callable[[str, Any], float | None]:
    number = _float_range(lo, hi)

    def parse(name: str, value: Any) -> float | None:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            return None
        return number(name, value)

    return parse


def _optional_str(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError("must be a string")
    text = value.strip()
    if len(text) > 2048:
        raise ConfigError("must be at most 2048 characters")
    return text or None


def _name(name: str, value: Any) -> str:
    text = _optional_str(name, value)
    if text is None:
        raise ConfigError("must be a non-empty string")
    return text


_HOST = re.compile(r"[A-Za-z0-9._:%-]+")  # names, IPv4, IPv6 (with a zone): ASCII only


def _host(name: str, value: Any) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if not _HOST.fullmatch(text) or len(text) > 255:
        raise ConfigError("must be a host name or IP address, for example '127.0.0.1'")
    return text


def _endpoint(name: str, value: Any) -> str | None:
    text = _optional_str(name, value)
    if text is not None and not text.startswith(("http://", "https://")):
        raise ConfigError("must be a URL starting with http:// or https://")
    return text


MAX_PROFILE_STEPS = 1000


def _parse_range(value: Any) -> tuple[int, int] | None:
    if isinstance(value, str):
        first, sep, last = value.strip().partition("-")
        if not _digits(first) or (sep and not _digits(last)):
            return None
        a = int(first)
        return a, int(last) if sep else a
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return int(value[0]), int(value[1])
    return None


def _digits(text: str) -> bool:
    text = text.strip()
    return text.isascii() and text.isdigit()


def _step_range(name: str, value: Any) -> tuple[int, int] | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off")):
        return None
    steps = _parse_range(value)
    if steps is None or not 0 <= steps[0] <= steps[1] <= 10**12:
        raise ConfigError("must be a step range FIRST-LAST (e.g. '10-12'), one step, or 'off'")
    if steps[1] - steps[0] >= MAX_PROFILE_STEPS:
        raise ConfigError(f"must cover at most {MAX_PROFILE_STEPS} steps (e.g. '10-12')")
    return steps


def _snapshot_mode(name: str, value: Any) -> str:
    text = value.strip().lower() if isinstance(value, str) else value
    if text in ("off", "oom"):
        return str(text)
    steps = _parse_range(text) if isinstance(text, str) else None
    if steps is None or not 0 <= steps[0] <= steps[1] <= 10**12:
        raise ConfigError("must be 'off', 'oom' or a step range FIRST-LAST (e.g. '10-12')")
    return f"{steps[0]}-{steps[1]}"


def _directory(name: str, value: Any) -> str:
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str) or not text.strip() or len(text) > 4096 or "\0" in text:
        raise ConfigError("must be a directory path (a non-empty string)")
    return text.strip()


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Settings:
    """Everything otel-train can be told. Field docs double as the README table."""

    service_name: str | None = field(
        default=None,
        metadata={
            "parse": _optional_str,
            "doc": "service.name; default OTEL_SERVICE_NAME, else service.name in "
            "OTEL_RESOURCE_ATTRIBUTES, else default_service_name.",
        },
    )
    default_service_name: str = field(
        default=DEFAULT_SERVICE_NAME,
        metadata={
            "parse": _name,
            "doc": "service.name when neither service_name nor the standard variables name "
            "one: a script's own name that OTEL_SERVICE_NAME overrides.",
        },
    )
    otlp_endpoint: str | None = field(
        default=None,
        metadata={
            "parse": _endpoint,
            "doc": "OTLP base URL. Default: the standard "
            "OTEL_EXPORTER_OTLP_ENDPOINT / _TRACES_ / _METRICS_ variables; none = no OTLP.",
        },
    )
    otlp_protocol: str = field(
        default="http/protobuf",
        metadata={
            "parse": _choice("http/protobuf", "grpc"),
            "std_env": "OTEL_EXPORTER_OTLP_PROTOCOL",
            "doc": "http/protobuf (fork-safe) or grpc.",
        },
    )
    prometheus: bool = field(
        default=True,
        metadata={"parse": _bool, "doc": "Serve /metrics when otel-train configures the SDK."},
    )
    prometheus_host: str = field(
        default="127.0.0.1",
        metadata={
            "parse": _host,
            "std_env": "OTEL_EXPORTER_PROMETHEUS_HOST",
            "doc": "Interface /metrics binds to (loopback unless you opt in).",
        },
    )
    prometheus_port: int = field(
        default=9464,
        metadata={
            "parse": _int_range(0, 65535),
            "std_env": "OTEL_EXPORTER_PROMETHEUS_PORT",
            "doc": "Port of /metrics (0 = any free port).",
        },
    )
    prometheus_ranks: str = field(
        default="offset",
        metadata={
            "parse": _choice("offset", "first", "all"),
            "doc": "/metrics with several ranks on a node: offset (port + LOCAL_RANK), "
            "first (local rank 0 only), all (every rank binds the same port: a clash errors).",
        },
    )
    metric_export_interval: float = field(
        default=10.0,
        metadata={
            "parse": _float_range(0.1, 3600.0),
            "doc": "Seconds between OTLP metric "
            "exports (OTEL_METRIC_EXPORT_INTERVAL, in ms, is honoured when set).",
        },
    )
    console_every: int = field(
        default=100,
        metadata={
            "parse": _int_range(0, 10**9),
            "doc": "Print the per-step phase table every "
            "N steps; 0 = never. The run summary prints at shutdown unless console is off.",
        },
    )
    console: str = field(
        default="stderr",
        metadata={
            "parse": _choice("stderr", "stdout", "off"),
            "doc": "Where tables go: stderr, stdout, off (no tables, no summary).",
        },
    )
    console_ranks: str = field(
        default="first",
        metadata={
            "parse": _choice("first", "all"),
            "doc": "With several ranks: first (global rank 0 alone prints tables and the "
            "summary), all (every rank prints, each table and summary naming its rank).",
        },
    )
    trace_steps: str = field(
        default="sampled",
        metadata={
            "parse": _choice("sampled", "all", "none"),
            "doc": "Which steps become "
            "traces: sampled (the slowest of each window, errors, the first step of each "
            "instrumentation and of each new step shape), all, none.",
        },
    )
    trace_window: int = field(
        default=1000,
        metadata={"parse": _int_range(1, 10**7), "doc": "Steps per sampling window."},
    )
    trace_window_seconds: float = field(
        default=60.0,
        metadata={
            "parse": _float_range(0.01, 86400.0),
            "doc": "A sampling window also closes after this many seconds.",
        },
    )
    trace_slowest: int = field(
        default=1,
        metadata={"parse": _int_range(0, 1000), "doc": "Slowest steps traced per window."},
    )
    device_timing: str = field(
        default="auto",
        metadata={
            "parse": _choice("auto", "cuda", "off"),
            "doc": "CUDA event timing: auto (when CUDA is available), cuda (required), off.",
        },
    )
    memory: bool = field(
        default=True,
        metadata={"parse": _bool, "doc": "Per-phase CUDA allocator peaks."},
    )
    reset_peak_memory: bool = field(
        default=True,
        metadata={
            "parse": _bool,
            "doc": "Reset the allocator's peak statistics at phase "
            "boundaries (exact per-phase peaks). Off: peaks are since the last reset "
            "anyone made (upper bounds), and your own resets are never disturbed.",
        },
    )
    max_pending_steps: int = field(
        default=1024,
        metadata={
            "parse": _int_range(1, 10**6),
            "doc": "Finished steps held while their "
            "CUDA events resolve; beyond it the oldest is dropped and counted.",
        },
    )
    shutdown_timeout: float = field(
        default=5.0,
        metadata={
            "parse": _float_range(0.0, 600.0),
            "doc": "Seconds shutdown() may take, flush included, even with the collector down.",
        },
    )
    sidecar: str = field(
        default="auto",
        metadata={
            "parse": _choice("auto", "off"),
            "doc": "Where metrics, tables, spans and exports are computed: auto (a sidecar "
            "process beside each training process when otel-train configures the SDK, so "
            "the training thread never waits for them; a thread when you pass providers "
            "or turn on profile_steps / memory_snapshot), off (always a thread).",
        },
    )
    flush_on_sigterm: bool = field(
        default=True,
        metadata={
            "parse": _bool,
            "doc": "On SIGTERM with no handler of yours installed: shutdown() (flush, within "
            "shutdown_timeout), then die by SIGTERM as before. Your own handler is called instead.",
        },
    )
    throughput_window: int = field(
        default=20,
        metadata={"parse": _int_range(2, 10**6), "doc": "Steps in the throughput gauge window."},
    )
    profile_steps: tuple[int, int] | None = field(
        default=None,
        metadata={
            "parse": _step_range,
            "doc": "Run torch.profiler over these steps (e.g. '10-12', at most 1000 steps); "
            "the trace goes to debug_dir and each covered step span gets an "
            "otel_train.profile event with its path.",
        },
    )
    memory_snapshot: str = field(
        default="off",
        metadata={
            "parse": _snapshot_mode,
            "doc": "CUDA allocator history: 'oom' (armed; on OutOfMemoryError the snapshot "
            "is dumped to debug_dir and linked from the failing phase span), a step range "
            "'10-12' (dumped when the range ends), or 'off'. Needs CUDA.",
        },
    )
    debug_dir: str = field(
        default="otel-train-debug",
        metadata={
            "parse": _directory,
            "doc": "Directory for profiler traces and memory snapshots.",
        },
    )

    flops: str = field(
        default="count",
        metadata={
            "parse": _choice("count", "estimate", "off"),
            "doc": "FLOPs per step for MFU: count (FlopCounterMode over one step per batch "
            "shape; that step runs slower), estimate (6 x trainable parameters x tokens, "
            "decoder-only transformers), off.",
        },
    )
    flops_per_step: float | None = field(
        default=None,
        metadata={
            "parse": _optional_float(0.0, 1e24),
            "doc": "FLOPs of one training step, if you know them (replaces counting).",
        },
    )
    flops_count_step: int = field(
        default=1,
        metadata={
            "parse": _int_range(0, 10**9),
            "doc": "Index of the step whose FLOPs are counted (1 = the second, after warm-up).",
        },
    )
    peak_tflops: float | None = field(
        default=None,
        metadata={
            "parse": _optional_float(1e-6, 1e7),
            "doc": "Dense peak TFLOP/s of one device for MFU; default: the datasheet table "
            "by device name (CUDA). Without it a CPU run has no MFU.",
        },
    )
    peak_dtype: str = field(
        default="auto",
        metadata={
            "parse": _choice("auto", "fp32", "tf32", "bf16", "fp16", "fp8"),
            "doc": "Dtype whose peak MFU uses; auto: the dtype the counted step's matmuls ran "
            "in (float32 is tf32 unless the matmul precision is 'highest'); without a count, "
            "the model's parameter dtype (set it when autocasting).",
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
                    f"otel_train setting '{name}' (from {source}) {err}; got {_shown(raw)}"
                ) from None
        if "metric_export_interval" not in values and "OTEL_METRIC_EXPORT_INTERVAL" in env:
            raw = env["OTEL_METRIC_EXPORT_INTERVAL"]
            try:
                values["metric_export_interval"] = (
                    _float_range(100.0, 3_600_000.0)("metric_export_interval", raw) / 1000.0
                )
            except ConfigError as err:
                raise ConfigError(
                    "otel_train setting 'metric_export_interval' (from environment variable "
                    f"OTEL_METRIC_EXPORT_INTERVAL, milliseconds) {err}; got {_shown(raw)}"
                ) from None
        return cls(**values)

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(Settings))


def settings_table() -> str:
    """Markdown table of every setting (used in the README)."""
    rows = ["| setting | environment | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(Settings):
        env = f"`{ENV_PREFIX}{f.name.upper()}`"
        if f.metadata.get("std_env"):
            env += f", `{f.metadata['std_env']}`"
        rows.append(f"| `{f.name}` | {env} | `{f.default!r}` | {f.metadata['doc']} |")
    return "\n".join(rows)
