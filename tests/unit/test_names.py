"""Shared names: the semantic conventions the contract emits (contract/conventions.py),
the deprecated aliases of what they renamed, and the telemetry schema (contract/schema.py,
schemas/<version>) that every tracer and meter of otel-train names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from otel_helpers import providers, tiny_loader, tiny_model, train_epoch

import otel_train
from otel_train import contract as c
from otel_train.export.resource import build_resource
from otel_train.settings import Settings
from otel_train.testing import InMemoryTelemetry

ROOT = Path(__file__).resolve().parents[2]
CONVENTIONS = {conv.name: conv for conv in c.CONVENTIONS}
REPLACED = {old: conv.name for conv in c.CONVENTIONS for old in conv.replaces}
ALIASES = {old.name: new.name for old, new in c.DEPRECATED_METRICS}


def contract_names() -> dict[str, tuple[str, str, str]]:
    """Every name the contract emits -> (signal, instrument or type, unit)."""
    out: dict[str, tuple[str, str, str]] = {}
    for a in c.RESOURCE_ATTRIBUTES:
        out[a.key] = ("resource", a.type, a.unit)
    for span in c.SPANS:
        for a in (*span.attributes, *span.links):
            out[a.key] = ("span", a.type, a.unit)
    for _where, attributes in c.EVENTS.values():
        for a in attributes:
            out[a.key] = ("span", a.type, a.unit)
    for m in c.METRICS:
        out[m.name] = ("metric", m.instrument, m.unit)
        for key in m.attributes:
            out[key] = ("metric attribute", "string", "")
    return out


def test_a_name_in_a_conventions_namespace_is_that_convention() -> None:
    for name, (signal, kind, unit) in contract_names().items():
        if name.startswith(c.SEMCONV_NAMESPACES):
            assert name in CONVENTIONS, f"{name}: a semantic-conventions namespace"
            conv = CONVENTIONS[name]
            assert (signal, kind, unit) == (conv.signal, conv.kind, conv.unit), name


def test_every_convention_the_contract_covers_is_emitted_under_its_name() -> None:
    names = contract_names()
    for conv in c.CONVENTIONS:
        assert names.get(conv.name, ("",))[0] == conv.signal, conv.name


def test_no_figure_a_convention_defines_is_emitted_under_another_name() -> None:
    """Statically: no current name is one a convention replaced; the old names live on
    only as deprecated aliases of the convention, until their removal."""
    assert not set(contract_names()) & set(REPLACED)
    assert ALIASES == REPLACED
    assert tuple(map(int, c.SCHEMA_VERSION.split("."))) < tuple(map(int, c.REMOVED_IN.split(".")))


def emitted(tel: InMemoryTelemetry) -> dict[str, Any]:
    """What one real run sends: metric name -> its scope's schema URL and data; the spans."""
    model, opt = tiny_model()
    loader = tiny_loader(n=16, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, trace_steps="all",
                          console="off", **providers(tel))  # fmt: skip
    train_epoch(model, opt, loader, record=True)
    otel_train.flush()
    data = tel.reader.get_metrics_data()
    metrics = {
        m.name: (sm.schema_url, m.data)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    return {"metrics": metrics, "spans": tel.spans()}


def test_a_run_emits_the_conventions_names_and_the_aliases_beside_them() -> None:
    run = emitted(InMemoryTelemetry())
    names = set(run["metrics"])
    for name in names:
        assert name not in REPLACED or REPLACED[name] in names, name  # an alias, not alone
        assert name in contract_names() or name in ALIASES, name
    for conv in c.CONVENTIONS:
        if conv.signal == "metric" and conv.name in names:
            assert type(run["metrics"][conv.name][1]).__name__ == "Sum"  # an updowncounter
            assert not run["metrics"][conv.name][1].is_monotonic
    resource = build_resource(Settings.resolve({})).attributes
    for key in resource:
        if key.startswith(c.SEMCONV_NAMESPACES) and not key.startswith("telemetry.sdk."):
            assert key in CONVENTIONS, key


def test_every_tracer_and_meter_names_the_schema() -> None:
    run = emitted(InMemoryTelemetry())
    assert run["metrics"] and {url for url, _ in run["metrics"].values()} == {c.SCHEMA_URL}
    assert run["spans"]
    assert {s.instrumentation_scope.schema_url for s in run["spans"]} == {c.SCHEMA_URL}


def test_the_schema_file_is_the_contracts() -> None:
    path = ROOT / "schemas" / c.SCHEMA_VERSION
    assert path.read_text() == c.render_schema(), "run `make docs`"
    schema = yaml.safe_load(path.read_text())
    assert schema["file_format"] == c.SCHEMA_FILE_FORMAT
    assert schema["schema_url"] == c.SCHEMA_URL == f"{c.SCHEMA_FAMILY}/{c.SCHEMA_VERSION}"
    versions = list(schema["versions"])
    assert versions[0] == c.SCHEMA_VERSION
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
    renames: dict[str, str] = {}
    for body in schema["versions"].values():
        for change in ((body or {}).get("metrics") or {}).get("changes", []):
            renames.update(change["rename_metrics"])
    assert renames == ALIASES  # every rename is a deprecated alias, and the other way round
    assert set(renames.values()) <= {m.name for m in c.METRICS}
    assert not set(renames) & {m.name for m in c.METRICS}
