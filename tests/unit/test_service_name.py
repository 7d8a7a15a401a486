"""The service's name on the resource: service_name > OTEL_SERVICE_NAME > service.name in
OTEL_RESOURCE_ATTRIBUTES > default_service_name > 'otel-train'."""

from __future__ import annotations

import pytest

from otel_train.export.resource import build_resource
from otel_train.settings import Settings

VARIABLES = (
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRAIN_SERVICE_NAME",
    "OTEL_TRAIN_DEFAULT_SERVICE_NAME",
)


@pytest.mark.parametrize(
    ("env", "kwargs", "name"),
    [
        ({}, {}, "otel-train"),
        ({}, {"default_service_name": "job"}, "job"),
        ({"OTEL_TRAIN_DEFAULT_SERVICE_NAME": "env-default"}, {}, "env-default"),
        (
            {"OTEL_TRAIN_DEFAULT_SERVICE_NAME": "env-default"},
            {"default_service_name": "job"},
            "job",
        ),
        ({"OTEL_SERVICE_NAME": "env"}, {"default_service_name": "job"}, "env"),
        ({"OTEL_SERVICE_NAME": ""}, {"default_service_name": "job"}, "job"),
        (
            {"OTEL_RESOURCE_ATTRIBUTES": "team=rl, service.name = attr"},
            {"default_service_name": "job"},
            "attr",
        ),
        # Keys are whole: my.service.name is not service.name; an item without '=' is none.
        (
            {"OTEL_RESOURCE_ATTRIBUTES": "my.service.name=x,service.name"},
            {"default_service_name": "job"},
            "job",
        ),
        (
            {"OTEL_SERVICE_NAME": "env", "OTEL_RESOURCE_ATTRIBUTES": "service.name=attr"},
            {"default_service_name": "job"},
            "env",
        ),
        ({"OTEL_SERVICE_NAME": "env"}, {"service_name": "explicit"}, "explicit"),
        ({"OTEL_SERVICE_NAME": "env", "OTEL_TRAIN_SERVICE_NAME": "train"}, {}, "train"),
    ],
)
def test_service_name_precedence(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], kwargs: dict[str, str], name: str
) -> None:
    for var in VARIABLES:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    resource = build_resource(Settings.resolve(kwargs))
    assert resource.attributes["service.name"] == name
