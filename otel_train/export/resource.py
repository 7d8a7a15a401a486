"""The resource every export carries: service, rank identity, host.

Rank attributes come from torchrun / SLURM environment variables when present.
``service.instance.id`` is unique per process and set again after ``fork``.
"""

from __future__ import annotations

import os
import socket
import uuid

from opentelemetry.sdk.resources import Resource

from .. import contract as c
from ..settings import Settings

DEFAULT_SERVICE_NAME = "otel-train"


def env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                continue
    return None


def rank() -> int:
    return env_int("RANK", "SLURM_PROCID") or 0


def rank_attributes() -> dict[str, object]:
    attrs: dict[str, object] = {c.RESOURCE_RANK.key: rank()}
    local = env_int("LOCAL_RANK", "SLURM_LOCALID")
    if local is not None:
        attrs[c.RESOURCE_LOCAL_RANK.key] = local
    world = env_int("WORLD_SIZE", "SLURM_NTASKS")
    if world is not None:
        attrs[c.RESOURCE_WORLD_SIZE.key] = world
    job = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID")
    if job:
        attrs[c.RESOURCE_JOB.key] = job[:256]
    return attrs


def build_resource(settings: Settings) -> Resource:
    attrs: dict[str, object] = {
        "service.instance.id": str(uuid.uuid4()),
        "host.name": socket.gethostname(),
        **rank_attributes(),
    }
    if settings.service_name:
        attrs["service.name"] = settings.service_name
    elif not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        attrs["service.name"] = DEFAULT_SERVICE_NAME
    return Resource.create(attrs)  # type: ignore[arg-type]
