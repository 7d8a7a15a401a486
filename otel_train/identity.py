"""Who this process is in the job: its ranks and the world size, from the launcher.

The one place the launcher's environment is read for ranks; the resource
(``export/resource.py``), the step spans and the debug components' file names use it.
First variable set to an integer wins: torchrun's, then SLURM's, then (node rank only)
a Kubernetes Indexed Job's.

- global rank: ``RANK``, ``SLURM_PROCID``; else 0.
- local rank (on the node): ``LOCAL_RANK``, ``SLURM_LOCALID``; else None.
- node rank: ``GROUP_RANK``, ``SLURM_NODEID``, ``JOB_COMPLETION_INDEX``; else None.
- world size: ``WORLD_SIZE``, ``SLURM_NTASKS``; else None.
- run id: ``OTEL_TRAIN_RUN_ID``, ``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``, ``K8S_JOB_NAME``.

Standard library only, and it imports nothing else from otel-train, so that the debug
components load without the rest of the package.
"""

from __future__ import annotations

import os


def env_int(*names: str) -> int | None:
    """The first of ``names`` set to an integer, as an int; None if none is."""
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                continue
    return None


def env_str(*names: str) -> str | None:
    """The first of ``names`` set to a non-blank value, stripped (at most 256 characters)."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value[:256]
    return None


def rank() -> int:
    """The global rank: ``RANK``, else ``SLURM_PROCID``, else 0."""
    return env_int("RANK", "SLURM_PROCID") or 0


def local_rank() -> int | None:
    """The rank on this node: ``LOCAL_RANK``, else ``SLURM_LOCALID``, else None."""
    return env_int("LOCAL_RANK", "SLURM_LOCALID")


def node_rank() -> int | None:
    """The node's index: ``GROUP_RANK``, ``SLURM_NODEID``, ``JOB_COMPLETION_INDEX``, or None."""
    return env_int("GROUP_RANK", "SLURM_NODEID", "JOB_COMPLETION_INDEX")


def world_size() -> int | None:
    """The number of ranks: ``WORLD_SIZE``, else ``SLURM_NTASKS``, else None."""
    return env_int("WORLD_SIZE", "SLURM_NTASKS")


def run_id() -> str | None:
    """The job/run id: ``OTEL_TRAIN_RUN_ID``, torchrun's ``TORCHELASTIC_RUN_ID`` (its
    static rendezvous leaves it at "none"), ``SLURM_JOB_ID``, ``K8S_JOB_NAME``; or None."""
    elastic = env_str("TORCHELASTIC_RUN_ID")
    if elastic == "none":
        elastic = None
    return env_str("OTEL_TRAIN_RUN_ID") or elastic or env_str("SLURM_JOB_ID", "K8S_JOB_NAME")


__all__ = ["env_int", "env_str", "local_rank", "node_rank", "rank", "run_id", "world_size"]
