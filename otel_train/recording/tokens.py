"""Off-policy links: what a remote phase hands back with its result, and what the
consuming step makes of it.

A rollout made in a generator under policy version k is often consumed by a later
trainer step, at version j (async RL). The generator's remote phase returns a *token*
(``rollout.produced()``, after the ``with`` block); the token travels back with the
rollout, and in the trainer ``otel_train.consumed(token, policy_version=j)`` inside the
consuming step gives that step's span an OpenTelemetry span link to the rollout's span,
records ``j - k`` in the staleness histogram, and shows the rollout's figures (host
seconds, peak memory, from the generator) in the trainer's console table and run
summary as a phase marked with the generator's role.

The token is a small dict of strings, like a carrier: ``traceparent`` names the
rollout's own span (its id is chosen when the remote phase is entered, so it is known
before the span is built, export/ids.py), ``baggage`` the trainer's step index, the run
id and k; beside them the phase's name, the generator's role and its figures under the
contract's attribute keys. A rollout under a bad carrier hands back figures only: no
link, no staleness. A token that cannot be read is warned about once per session.

Usage::

    with otel_train.phase("rollout", parent=carrier) as rollout:   # the generator
        result = generate(...)
    send(result, rollout.produced())

    with otel_train.step():                                         # the trainer, later
        result, token = receive()
        otel_train.consumed(token, policy_version=j)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from .. import contract as c
from .links import MAX_CARRIER, Parent, StepLink, carrier_dict, parse_carrier
from .values import clean_name

_log = logging.getLogger("otel_train")
MAX_CONSUMED = 128  # consumed tokens kept per step (the SDK's default link limit)
MAX_PRODUCED = 256  # finished remote phases whose figures wait for produced()
_NAME, _ROLE = c.PHASE_NAME.key, c.RESOURCE_ROLE.key
_SECONDS, _PEAK = c.PHASE_HOST_DURATION.key, c.PHASE_PEAK_ALLOCATED.key
_TOTAL = c.DEVICE_MEMORY_LIMIT.name


class Consumed(NamedTuple):
    """A consumed rollout, as the consuming step keeps it."""

    trace_id: int  # 0: no link (a rollout under a bad carrier)
    span_id: int
    sampled: bool  # its span exists: the step links to it
    name: str  # the producing phase
    role: str  # the generator's role setting ("" if unset)
    seconds: float | None  # its host seconds there
    peak: int | None  # its peak allocated bytes there (CUDA)
    device_total: int | None  # that device's memory
    policy_version: int | None  # k
    staleness: int | None  # j - k


def produced_token(
    name: str,
    parent: Parent | None,
    span_id: int,
    run: str | None,
    role: str | None,
    figures: tuple[float, Any] | None,
    device_total: int | None,
) -> dict[str, str]:
    """The token of a remote phase: its span's ids (if its carrier was good) and its
    figures (``(host seconds, memory row or None)`` once it has ended)."""
    out: dict[str, str] = {}
    if parent is not None:
        link = StepLink(parent.trace_id, span_id, 0, parent.sampled)
        out.update(carrier_dict(link, parent.step_index, run, parent.policy_version))
    out[_NAME] = name
    if role:
        out[_ROLE] = role
    if figures is not None:
        seconds, memory = figures
        out[_SECONDS] = repr(float(seconds))
        if memory is not None:
            out[_PEAK] = str(int(memory[0]))
            if device_total:
                out[_TOTAL] = str(int(device_total))
    return out


def parse_token(token: Any, mine: str | None, version: int | None) -> tuple[Consumed | None, str]:
    """(what ``token`` says, "") or (None, why it says nothing); ``version``: j."""
    if not isinstance(token, Mapping) or not token:
        kind = "an empty token" if isinstance(token, Mapping) else type(token).__name__
        return None, f"not a token from phase(...).produced() ({kind})"
    name = token.get(_NAME)
    if not isinstance(name, str):
        return None, f"no phase name in {dict(token)!r:.120}"
    parent: Parent | None = None
    if "traceparent" in token:
        parent, why = parse_carrier(token, mine)
        if parent is None:
            return None, why
    k = parent.policy_version if parent is not None else None
    role = token.get(_ROLE)
    return Consumed(
        parent.trace_id if parent is not None else 0,
        parent.span_id if parent is not None else 0,
        parent is not None and parent.sampled,
        clean_name(name),
        clean_name(role) if isinstance(role, str) else "",
        _number(token.get(_SECONDS), float),
        _number(token.get(_PEAK), int),
        _number(token.get(_TOTAL), int),
        k,
        version - k if version is not None and k is not None else None,
    ), ""


def _number(text: Any, kind: type) -> Any:
    """A finite, non-negative number of ``kind`` from a token's string, else None."""
    if not isinstance(text, str) or len(text) > MAX_CARRIER:
        return None
    try:
        value = kind(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def warn_bad_token(why: str) -> None:
    _log.warning(
        "otel-train: otel_train.consumed() got %s; nothing was linked (warned once per "
        "session). A token is what phase(name, parent=carrier).produced() returned in a "
        "process of this run, given to consumed() inside a step.",
        why,
    )


def observe_staleness(blocks: list[Any], agg: Any, publisher: Any) -> None:
    """The staleness of every rollout the blocks' steps consumed, into its histogram
    (the worker's call; ``publisher``: instruments.Publisher, when histograms go
    through the API)."""
    values = [
        float(x.staleness)
        for block in blocks
        for i in block.consumed
        for x in block.step(i).consumed or ()
        if x.staleness is not None
    ]
    if not values:
        return
    spec = c.POLICY_STALENESS
    with agg.lock:
        agg.histogram(spec.name, (), spec.buckets).observe_many(values)
    if publisher is not None and publisher.histograms:
        for v in values:
            publisher.record(spec.name, (), v)
