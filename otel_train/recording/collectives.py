"""Collectives as phases: a blocking collective the training thread runs is a phase of its
own, named so that every consumer can tell it from the user's phases.

A collective's phase is entered and exited like any other (events on CUDA, the deferred
log without), inside the phase it ran in, so its time is where it belongs: waiting, not
that phase's own work. The name carries the op as torch.distributed names it and the
process group's name; :func:`parse` gives them back. Consumers read the split from
:class:`Waits`: metrics (``otel_train.collective.duration``), the console (``waiting in
all_reduce`` rows, the parent's own time), spans (``otel_train.phase.collective_wait``).

Usage::

    name = phase_name("all_reduce", "default_pg")   # "otel_train.collective:all_reduce@default_pg"
    parse(name)                                     # ("all_reduce", "default_pg")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PREFIX = "otel_train.collective:"  # phase names with it are reserved for collectives
DDP_OP = "ddp_all_reduce"  # DDP's gradient buckets, waited for at the end of backward
DEFAULT_GROUP = "default_pg"
_NAMES: dict[int, str] = {}  # id(process group) -> its name (groups live as long as the job)


def phase_name(op: str, group: str) -> str:
    return f"{PREFIX}{op}@{group}"


def parse(name: str) -> tuple[str, str] | None:
    """``(op, group)`` of a collective's phase name, None for any other phase."""
    if not name.startswith(PREFIX):
        return None
    op, _, group = name[len(PREFIX) :].partition("@")
    return op, group


def label(name: str) -> str:
    """How tables name a collective's row: ``waiting in all_reduce`` (the group when it is
    not the default one); other phases as they are."""
    parsed = parse(name)
    if parsed is None:
        return name
    op, group = parsed
    return f"waiting in {op}" if group == DEFAULT_GROUP else f"waiting in {op} [{group}]"


class Waits:
    """Where a step shape's collectives sit: for each row, the collective rows directly
    inside it, and the top-level collective rows (made once per shape)."""

    __slots__ = ("any", "inside", "rows", "top")

    def __init__(self, seqs: Sequence[int], parents: Sequence[int], names: Sequence[str]) -> None:
        self.rows = [i for i, n in enumerate(names) if n.startswith(PREFIX)]
        self.any = bool(self.rows)
        row_of = {seq: i for i, seq in enumerate(seqs)}
        self.inside: list[list[int]] = [[] for _ in names]
        self.top: list[int] = []
        for i in self.rows:
            parent = row_of.get(parents[i])
            if parent is None:
                self.top.append(i)
            else:
                self.inside[parent].append(i)


def group_name(group: Any) -> str:
    """A process group's name: its description (``default_pg``, or what ``new_group``
    was given), else its number; the default group's when ``group`` is None."""
    key = id(group)
    name = _NAMES.get(key)
    if name is None:
        if group is None:
            name = DEFAULT_GROUP
        else:
            desc = str(getattr(group, "group_desc", "") or "")
            name = desc if desc and desc != "undefined" else str(getattr(group, "group_name", ""))
        if len(_NAMES) < 1024:
            _NAMES[key] = name
    return name


def sequence_number(group: Any) -> int | None:
    """The group's count of collectives issued (C++, no communication), None if unknown."""
    try:
        if group is None:
            import torch.distributed as dist

            group = dist.distributed_c10d._get_default_group()
        return int(group._get_sequence_number_for_group())
    except Exception:
        return None
