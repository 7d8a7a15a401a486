"""The resource every export carries: service, rank identity, node, job.

Rank attributes come from the launcher's environment when present (the ranks and world
size are read by ``otel_train/identity.py``): torchrun (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``GROUP_RANK``, ``TORCHELASTIC_RUN_ID``), SLURM (``SLURM_PROCID``,
``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODEID``, ``SLURM_JOB_ID``,
``SLURMD_NODENAME``) or a Kubernetes Indexed Job (``JOB_COMPLETION_INDEX``, plus the
downward-API variables ``K8S_POD_NAME``, ``K8S_NAMESPACE_NAME``, ``K8S_NODE_NAME`` and
``K8S_JOB_NAME`` that deploy/k8s/training-job.yaml defines). ``OTEL_TRAIN_RUN_ID``
overrides the job id.

``service.instance.id``: with a job id, a UUIDv5 of (job, rank), the same for a rank
restarted by torchelastic (no new series per restart) and different for every rank;
without one, a random UUID per process. Either way a forked child that builds its
own SDK gets a fresh id (``os.register_at_fork``).
"""

from __future__ import annotations

import os
import socket
import uuid

from opentelemetry.sdk.resources import Resource, ResourceDetector

from .. import contract as c
from ..identity import env_int, env_str, local_rank, node_rank, rank, run_id, world_size
from ..settings import DEFAULT_SERVICE_NAME, Settings
from .run_facts import start_facts

# The ranks are read in identity.py; re-exported here under their old names.
__all__ = [
    "DEFAULT_SERVICE_NAME",
    "RankResourceDetector",
    "build_resource",
    "env_int",
    "env_str",
    "host_name",
    "instance_id",
    "local_rank",
    "metrics_port",
    "node_rank",
    "rank",
    "rank_attributes",
    "world_size",
]

# Namespace of the per-rank UUIDv5 (a fixed random UUID, so ids are stable across versions).
_INSTANCE_NAMESPACE = uuid.UUID("6b0d4b9e-5c1f-4f0e-9d1a-2f7c3e8a9b10")
_forked = False


def _after_fork_in_child() -> None:
    global _forked
    _forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def rank_attributes() -> dict[str, object]:
    attrs: dict[str, object] = {c.RESOURCE_RANK.key: rank()}
    optional: dict[str, object | None] = {
        c.RESOURCE_LOCAL_RANK.key: local_rank(),
        c.RESOURCE_WORLD_SIZE.key: world_size(),
        c.RESOURCE_NODE_RANK.key: node_rank(),
        c.RESOURCE_JOB.key: run_id(),
        "k8s.pod.name": env_str("K8S_POD_NAME"),
        "k8s.namespace.name": env_str("K8S_NAMESPACE_NAME"),
        "k8s.node.name": env_str("K8S_NODE_NAME"),
        "k8s.job.name": env_str("K8S_JOB_NAME"),
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    return attrs


def instance_id(attrs: dict[str, object]) -> str:
    """UUIDv5 of (job, rank) when the job is known and this is not a forked child."""
    job = attrs.get(c.RESOURCE_JOB.key)
    if job is None or _forked:
        return str(uuid.uuid4())
    return str(uuid.uuid5(_INSTANCE_NAMESPACE, f"{job}/{attrs[c.RESOURCE_RANK.key]}"))


def host_name() -> str:
    return env_str("K8S_NODE_NAME", "SLURMD_NODENAME") or socket.gethostname()


def build_resource(
    settings: Settings, consumer: str | None = None, version: str | None = None
) -> Resource:
    """``consumer``: where this SDK's steps are consumed ("sidecar" or "thread"), and
    ``version``: otel-train's, with the other run facts known at start, for otel-train's
    own SDK."""
    ranks = rank_attributes()
    attrs: dict[str, object] = {
        "service.instance.id": instance_id(ranks),
        "host.name": host_name(),
        **ranks,
    }
    if settings.role:
        attrs[c.RESOURCE_ROLE.key] = settings.role
    if consumer is not None:
        attrs[c.RESOURCE_CONSUMER.key] = consumer
    if version is not None:
        facts = start_facts(settings, version)
        attrs.update({k: v for k, v in facts.items() if v is not None})
    if settings.service_name:
        attrs["service.name"] = settings.service_name
    elif not _environment_names_service():
        attrs["service.name"] = settings.default_service_name
    return Resource.create(attrs)  # type: ignore[arg-type]


class RankResourceDetector(ResourceDetector):
    """The rank identity of :func:`build_resource` for an SDK otel-train did not build:
    the ``otel_train`` entry point of ``opentelemetry_resource_detector``
    (``OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=otel_train`` under ``opentelemetry-instrument``),
    so that the dashboards and straggler rules see each rank."""

    def detect(self) -> Resource:
        ranks = rank_attributes()
        attrs = {"service.instance.id": instance_id(ranks), "host.name": host_name(), **ranks}
        return Resource(attrs)  # type: ignore[arg-type]


def service_name(settings: Settings) -> str:
    """The service.name this process's resource carries."""
    return str(build_resource(settings).attributes.get("service.name", "unknown_service"))


def _environment_names_service() -> bool:
    """Whether the SDK's own variables name the service: OTEL_SERVICE_NAME, or a
    ``service.name`` key in OTEL_RESOURCE_ATTRIBUTES (its ``key=value`` items, as the SDK
    splits them)."""
    if os.environ.get("OTEL_SERVICE_NAME"):
        return True
    items = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    return any(
        key.strip() == "service.name" for key, eq, _ in (i.partition("=") for i in items) if eq
    )


def metrics_port(settings: Settings) -> int | None:
    """The /metrics port of this rank under the ``prometheus_ranks`` policy; None = serve none."""
    local = local_rank() or 0
    if settings.prometheus_ranks == "first":
        return settings.prometheus_port if local == 0 else None
    if settings.prometheus_ranks == "offset" and settings.prometheus_port != 0:
        return settings.prometheus_port + local
    return settings.prometheus_port
