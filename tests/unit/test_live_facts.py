"""A live job's run facts (runs/live.py): the resource of otel-train's own SDK as
Prometheus's OTLP receiver keeps it on ``target_info`` (each attribute a label, dots as
underscores, an empty value dropped) and the ``torch.compiled`` gauge's series read back
into the facts a run record's ``run.json`` holds."""

from __future__ import annotations

from typing import Any

from otel_train import contract as c
from otel_train.export.resource import build_resource
from otel_train.export.run_facts import run_facts
from otel_train.runs.live import add_facts, records
from otel_train.settings import Settings

VERSION = "9.9"


def _target_info(settings: Settings, version: str | None = VERSION) -> dict[str, Any]:
    """A target_info sample as the query API answers, from the resource as built."""
    attributes = build_resource(settings, "thread", version).attributes
    labels = {c.prometheus_label(k): str(v) for k, v in attributes.items() if str(v)}
    labels.update(job="svc", instance=str(attributes["service.instance.id"]))
    return {"metric": labels, "value": [1000.0, "1"]}


def _compiled_series(instance: str, values: list[str]) -> dict[str, Any]:
    name = c.prometheus_base_name(c.TORCH_COMPILED)
    labels = {"__name__": name, "job": "svc", "instance": instance, "service_name": "svc"}
    return {"metric": labels, "values": [[1000.0 + i, v] for i, v in enumerate(values)]}


def test_a_live_process_has_the_facts_its_record_would_hold() -> None:
    settings = Settings.resolve({"trace_steps": "all", "otlp_endpoint": "http://h:4318"})
    info = _target_info(settings)
    (rank,) = records([_compiled_series(info["metric"]["instance"], ["0", "1"])])
    add_facts([rank], [info])
    assert rank.facts == run_facts(settings, VERSION, compiled=True)


def test_no_setting_changed_reads_as_none_changed_not_as_unknown() -> None:
    info = _target_info(Settings())
    assert c.prometheus_label(c.RUN_SETTINGS.key) not in info["metric"]  # (an empty label)
    (rank,) = records([_compiled_series(info["metric"]["instance"], ["0"])])
    add_facts([rank], [info])
    assert rank.facts == run_facts(Settings(), VERSION, compiled=False)


def test_a_process_on_an_sdk_otel_train_did_not_build_has_only_its_compile_state() -> None:
    """The application's providers (the relay) carry otel-train's metrics, not its
    resource attributes: the facts known at start read as not known."""
    info = _target_info(Settings(), version=None)
    (rank,) = records([_compiled_series(info["metric"]["instance"], ["1"])])
    add_facts([rank], [info])
    assert rank.facts == {c.RUN_TORCH_COMPILE.key: True}
