"""docs/telemetry.md, rendered from the telemetry contract (``otel-train telemetry``, or
``python -m otel_train.contract``)."""

from __future__ import annotations

from typing import Any

from .attributes import RESOURCE_ATTRIBUTES, RUN_FACTS
from .conventions import CONVENTIONS, PEER_NAMES, SEMCONV_VERSION
from .derived import DERIVED
from .events import EVENTS, LOG_EVENTS
from .metrics import (
    DURATION_BUCKETS,
    DURATION_MAX_SCALE,
    DURATION_MAX_SIZE,
    METRIC_ATTRIBUTES,
    METRICS,
    TORCH_COMPILED,
)
from .prometheus import prometheus_base_name
from .schema import DEPRECATED_METRICS, REMOVED_IN, SCHEMA_URL, SCHEMA_VERSION
from .spans import ADAPTER_PHASES, SPANS
from .specs import SCOPE_NAME

# --- generated reference ---------------------------------------------------------------


def render_markdown() -> str:
    """The text of docs/telemetry.md."""
    out = [
        "# Telemetry reference",
        "",
        "Generated from `otel_train/contract/` by `otel-train telemetry`; "
        "a test keeps this file identical to that output. Do not edit by hand.",
        "",
        f"Instrumentation scope: `{SCOPE_NAME}`, schema URL `{SCHEMA_URL}` (on every tracer "
        "and meter; [Schema](#schema)). Units are UCUM.",
        "",
    ]
    out += _spans_section()
    out += _metrics_section()
    out += _names_section()
    out.append("")
    return "\n".join(out)


def _attribute_rows(attributes: Any, header: str = "attribute") -> list[str]:
    rows = [f"| {header} | type | unit | description |", "|---|---|---|---|"]
    rows += [f"| `{a.key}` | {a.type} | `{a.unit or '-'}` | {a.description} |" for a in attributes]
    return rows


def _spans_section() -> list[str]:
    out = [
        "## Spans",
        "",
        "One trace per sampled training step: the step span is the root and phases are its "
        "children (nested phases nest).",
        "",
    ]
    for span in SPANS:
        out += [f"### `{span.name}`", "", span.description, ""]
        out += [*_attribute_rows(span.attributes), ""]
        if span.links:
            out += ["Attributes of its span links:", ""]
            out += [*_attribute_rows(span.links, "link attribute"), ""]
    out += ["### Phase names from the adapters", "", "| phase | what it covers |", "|---|---|"]
    for name, what in ADAPTER_PHASES.items():
        out.append(f"| `{name}` | {what} |")
    for event, (where, attributes) in EVENTS.items():
        out += ["", f"### Event `{event}`", "", where, ""]
        out += _attribute_rows(attributes)
    out += _log_events_section()
    out += ["", "## Resource attributes", "", "Set when otel-train builds the SDK itself.", ""]
    out += ["| attribute | type | description |", "|---|---|---|"]
    for a in RESOURCE_ATTRIBUTES:
        out.append(f"| `{a.key}` | {a.type} | {a.description} |")
    out += ["", "## Run facts", "", "Each rank's `rank<R>.run.json` in the run record, written "
            "at shutdown (`otel-train compare` lists those that differ). For a job in a live "
            "stack: those known at start are resource attributes above (Prometheus holds "
            "them on `target_info`), and whether a model ran under torch.compile is the "
            f"`{TORCH_COMPILED.name}` gauge.", ""]  # fmt: skip
    out += ["| key | type | description |", "|---|---|---|"]
    out += [f"| `{a.key}` | {a.type} | {a.description} |" for a in RUN_FACTS]
    return out


def _log_events_section() -> list[str]:
    out = [
        "",
        "## Log records",
        "",
        "Events sent over the logs signal (OTLP `/v1/logs`), each a log record whose "
        "`event_name` is the event's name, with the resource of every other signal "
        "(the rank included).",
    ]
    for event, (when, severity, attributes) in LOG_EVENTS.items():
        out += ["", f"### Log event `{event}` (severity {severity})", "", when, ""]
        out += _attribute_rows(attributes)
    return out


def _metrics_section() -> list[str]:
    out = [
        "",
        "## Metrics",
        "",
        "Prometheus names are those of Prometheus's OTLP receiver; the in-process `/metrics` "
        "endpoint names gauges of unit `1` without the `_ratio` suffix.",
        "",
        "Over OTLP the duration histograms are base-2 exponential histograms (at most "
        f"{DURATION_MAX_SIZE} buckets, scale {DURATION_MAX_SCALE} or lower: a bucket grows "
        f"by {2**2**-DURATION_MAX_SCALE:.2f}x), which Prometheus stores as native "
        "histograms: one series each, read with `histogram_quantile`, `histogram_sum` and "
        "`histogram_count`. The in-process `/metrics` endpoint serves them as classic "
        "histograms (`_bucket`, `_sum`, `_count`) with the explicit boundaries below.",
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
    out += ["", "Explicit duration histogram bucket boundaries (seconds, `/metrics`): "]
    out.append(", ".join(f"{b:g}" for b in DURATION_BUCKETS) + ".")
    for m in METRICS:
        if m.buckets is not None:
            bounds = ", ".join(f"{b:g}" for b in m.buckets)
            out += ["", f"`{m.name}` bucket boundaries (`{m.unit}`): {bounds}."]
    out += ["", "## Metric attributes", "", "| attribute | meaning |", "|---|---|"]
    for key, meaning in METRIC_ATTRIBUTES.items():
        out.append(f"| `{key}` | {meaning} |")
    return out + _derived_section()


def _derived_section() -> list[str]:
    out = [
        "",
        "## Figures computed in PromQL",
        "",
        "No rank exports these: each equals an expression over series it sends anyway, so "
        "Prometheus computes it when asked (fewer series per rank: `docs/scale.md`). The "
        "console, the run summary, the report page and the step spans carry them "
        "directly. The queries below are per rank of one job, over 5 minutes where the "
        "figure is over a window; the dashboards use the same expressions.",
        "",
        "| figure | unit | over | description | PromQL |",
        "|---|---|---|---|---|",
    ]
    for d in DERIVED:
        query = d.query('job="$job"', "otel_train_rank", "5m").replace("|", "\\|")
        over = {"window": "5 min", "run": "the run", "latest": "latest value"}[d.over]
        out.append(f"| {d.name} | `{d.unit}` | {over} | {d.description} | `{query}` |")
    return out


def _names_section() -> list[str]:
    out = [
        "",
        "## Standard names",
        "",
        f"Compared with the OpenTelemetry semantic conventions {SEMCONV_VERSION} (`service.*`, "
        "`host.*`, `process.*`, `system.*`, `k8s.*`, `hw.*`): where one defines a figure "
        "otel-train emits, otel-train emits it under that name, unit and instrument (a "
        "contract test fails otherwise). Training has no convention yet: step, phase, "
        "throughput and MFU names are otel-train's own, mapped below.",
        "",
        "| name | where | instrument or type | unit | otel-train's name before |",
        "|---|---|---|---|---|",
    ]
    for conv in CONVENTIONS:
        before = ", ".join(f"`{r}`" for r in conv.replaces) or "-"
        out.append(f"| `{conv.name}` | {conv.signal} | {conv.kind} | `{conv.unit or '-'}` "
                   f"| {before} |")  # fmt: skip
    out += _deprecated_rows()
    out += [
        "",
        "### The same figures elsewhere",
        "",
        "What Megatron-LM (`megatron.training.*`, spans `megatron.*`), NeMo Lens (`dl.*`, "
        "`nv.dl.*`: span and resource attributes) and the open `rl.*` proposal "
        "(semantic-conventions-genai #88; only its settled names are given) call "
        "otel-train's figures, for joining a mixed fleet's series. Units differ: Megatron "
        "reports ms, GB and TFLOP/s where otel-train reports s, By and FLOP/s.",
        "",
        "| figure | otel-train | Megatron | NeMo Lens | `rl.*` proposal |",
        "|---|---|---|---|---|",
    ]
    out += [f"| {' | '.join(row)} |" for row in PEER_NAMES]
    out += [
        "",
        "## Schema",
        "",
        f"Every tracer and meter of otel-train carries the schema URL `{SCHEMA_URL}`: "
        f"`schemas/{SCHEMA_VERSION}` in the repository is that file (OpenTelemetry schema "
        "file format 1.1.0), with each version's renames as its transformations. Version "
        "0.1.0 is the names before the schema (its telemetry has no schema URL).",
    ]
    return out


def _deprecated_rows() -> list[str]:
    out = [
        "",
        f"### Deprecated names (removed in {REMOVED_IN})",
        "",
        f"Since {SCHEMA_VERSION} each renamed metric is also emitted under its old name for "
        "one release, as a gauge with the same value (without attributes). Read the new "
        "names; `deploy/README.md` has what a Collector can do for a fleet that mixes "
        "versions.",
        "",
        "| deprecated | use | Prometheus (deprecated) | Prometheus (use) |",
        "|---|---|---|---|",
    ]
    for old, new in DEPRECATED_METRICS:
        out.append(f"| `{old.name}` | `{new.name}` | `{prometheus_base_name(old)}` | "
                   f"`{prometheus_base_name(new)}` |")  # fmt: skip
    return out
