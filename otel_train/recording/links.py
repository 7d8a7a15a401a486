"""One trace across processes: W3C trace-context carriers naming a step's span.

A trainer hands another process the carrier of its open step (``otel_train.carrier()``),
and there ``otel_train.phase("rollout", parent=carrier)`` becomes a span under that
step, in its trace (``step(parent=...)`` makes a whole step a child of it). Step spans
are built after the fact, off the training thread or in the sidecar, so the ids a
carrier names are chosen when it is asked for and kept on the step (a
:class:`StepLink`); the span emitter has the SDK give the step's span those ids
(export/ids.py).

The carrier is a dict of strings, the two W3C headers: ``traceparent`` (trace id, the
step span's id, the sampled flag) and ``baggage`` with the trainer's step index, its
run id (OTEL_TRAIN_RUN_ID, torchrun's, SLURM's, ...) and the policy version if given.

Sampling is decided once, where the trace starts: the first carrier a process hands out
says ``sampled``, then at most one per ``trace_window_seconds`` (every one with
``trace_steps='all'``); the trainer traces a step whose carrier was sampled whatever its
time, and the remote phases of it export spans. Under an unsampled carrier they feed
metrics only. A step the trainer's sampler keeps for being slow is known only once it
has ended, after its carriers left: its trace has no remote spans.

Usage::

    with otel_train.step():                        # the trainer
        work.put(otel_train.carrier(policy_version=k))
        ...
    with otel_train.phase("rollout", parent=work.get()):   # the generator
        ...
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from .. import contract as c
from ..settings import Settings

_log = logging.getLogger("otel_train")
TRACEPARENT, BAGGAGE = "traceparent", "baggage"
MAX_CARRIER = 512  # characters of a header read (a traceparent has 55)
_TRACEPARENT_RE = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_STEP, _RUN, _POLICY = c.STEP_INDEX.key, c.RESOURCE_JOB.key, c.POLICY_VERSION.key
UNSET: Any = object()  # ``parent=`` not given (an explicit None is a bad carrier)


class Parent(NamedTuple):
    """What a carrier names: the span to be a child of, and the trainer's step."""

    trace_id: int
    span_id: int
    sampled: bool
    step_index: int | None
    policy_version: int | None


class StepLink(NamedTuple):
    """A step's (or a remote phase tree's) place in a trace that crosses processes."""

    trace_id: int
    span_id: int  # the step span's, chosen for a carrier handed out (0: the SDK chooses)
    parent_id: int  # the remote parent span's (0: the step is the root of its trace)
    sampled: bool  # traced whatever the sampler would say
    step_index: int | None = None  # the parent's step (a remote phase's span carries it)
    policy_version: int | None = None
    hang: bool = False  # traced because it hung (its ids are in the hang record: hangs.py)

    @property
    def reason(self) -> str:
        """``sampled_because`` of a step traced for its link."""
        if self.parent_id:
            return "parent"
        return "hang" if self.hang else "carrier"

    @classmethod
    def under(cls, parent: Parent) -> StepLink:
        return cls(parent.trace_id, 0, parent.span_id, parent.sampled, parent.step_index,
                   parent.policy_version)  # fmt: skip


def carrier_dict(
    link: StepLink, step_index: int | None, run: str | None, policy_version: int | None
) -> dict[str, str]:
    """The carrier of ``link``'s step: its ``traceparent`` and ``baggage`` (``run``: this
    run's id, if known)."""
    flags = "01" if link.sampled else "00"
    items = [f"{_STEP}={step_index}"] if step_index is not None else []
    if run is not None:
        items.append(f"{_RUN}={_escape(run)}")
    if policy_version is not None:
        items.append(f"{_POLICY}={policy_version}")
    return {
        TRACEPARENT: f"00-{link.trace_id:032x}-{link.span_id:016x}-{flags}",
        BAGGAGE: ",".join(items),
    }


def parse_carrier(carrier: Any, mine: str | None) -> tuple[Parent | None, str]:
    """(the parent a carrier names, "") or (None, why it names none): a mapping with a
    W3C ``traceparent`` (what :func:`carrier_dict` made, HTTP headers, ``os.environ``
    with ``TRACEPARENT``) of this run (``mine``: its id, if known), or a ``traceparent``
    string itself."""
    if isinstance(carrier, str):
        carrier = {TRACEPARENT: carrier}
    if not isinstance(carrier, Mapping):
        return None, f"not a carrier (a {type(carrier).__name__})"
    if not carrier:
        return None, "an empty carrier (no step was open where it was made)"
    value = carrier.get(TRACEPARENT, carrier.get(TRACEPARENT.upper()))
    ids = _traceparent(value) if isinstance(value, str) else None
    if ids is None:
        return None, f"no valid W3C traceparent in {dict(carrier)!r:.120}"
    baggage = _baggage(carrier.get(BAGGAGE, carrier.get(BAGGAGE.upper())))
    run = baggage.get(_RUN)
    if run is not None and mine is not None and run != _escape(mine):
        return None, f"a carrier from another run ({run!r}; this is {mine!r})"
    return Parent(*ids, _int(baggage.get(_STEP)), _int(baggage.get(_POLICY))), ""


def _traceparent(value: str) -> tuple[int, int, bool] | None:
    """(trace id, span id, sampled) of a W3C traceparent: version-traceid-spanid-flags,
    lowercase hex, ids not zero, version ff invalid (and 00 exactly four fields)."""
    found = _TRACEPARENT_RE.fullmatch(value[:MAX_CARRIER].strip())
    if found is None:
        return None
    version, trace, span, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(flags, 16) & 1)


def _baggage(value: Any) -> dict[str, str]:
    """Our keys of a W3C baggage header (others, and properties, are left alone)."""
    out: dict[str, str] = {}
    if not isinstance(value, str):
        return out
    for item in value[:MAX_CARRIER].split(","):
        key, eq, rest = item.partition("=")
        key = key.strip()
        if eq and key in (_STEP, _RUN, _POLICY):
            out[key] = rest.split(";", 1)[0].strip()
    return out


def _escape(text: str) -> str:
    """A baggage value: characters outside its token set percent-encoded."""
    return "".join(ch if ch.isalnum() or ch in "-._~:/" else f"%{ord(ch):02X}" for ch in text)


def _int(text: str | None) -> int | None:
    if text is None or not text.isdigit() or len(text) > 18:
        return None
    return int(text)


def new_ids(trace_id: int = 0) -> tuple[int, int]:
    """A random (trace id, span id), or a span id in ``trace_id`` (never zero: invalid)."""
    while not trace_id:
        trace_id = int.from_bytes(os.urandom(16), "big")
    span_id = 0
    while not span_id:
        span_id = int.from_bytes(os.urandom(8), "big")
    return trace_id, span_id


class CarrierGate:
    """Whether the next carrier handed out is sampled (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self._every = settings.trace_steps == "all"
        self._window_ns = int(settings.trace_window_seconds * 1e9)
        self._next_ns: int | None = None

    def sampled(self, now_ns: int) -> bool:
        if self._every:
            return True
        if self._next_ns is not None and now_ns < self._next_ns:
            return False
        self._next_ns = now_ns + self._window_ns
        return True


def warn_bad_parent(why: str, where: str) -> None:
    """One warning; ``where``: "phase" (recorded as a phase of the step open here, as if
    no parent= were given; outside any step, on its own) or "step"."""
    what = (
        "a phase of the step open here, as if no parent= were given (outside any step: "
        "on its own, without a parent)"
        if where == "phase"
        else "a step without a parent"
    )
    _log.warning(
        "otel-train: %s(parent=...) got %s; it is recorded as %s (warned once per "
        "session). A carrier is what otel_train.carrier() returned inside a step of this "
        "run.",
        where,
        why,
        what,
    )


class StepLinks:
    """The open step's link (a mixin of the step machine, machine.py): the ids its
    carriers name, chosen when the first is asked for, or the trace it joined."""

    _current: Any  # the open step (layouts.Step), or None
    carriers: bool  # whether carriers may say sampled (the session sets it)
    _gate: CarrierGate

    def _own_link(self, t: int) -> StepLink | None:
        """The open step's link, with its span's ids chosen now if they were not: what
        a carrier handed out names (Recorder.carrier)."""
        step = self._current
        if step is None:
            return None
        link: StepLink | None = step.link
        if link is None:
            trace_id, span_id = new_ids()
            sampled = self.carriers and self._gate.sampled(t)
            link = step.link = StepLink(trace_id, span_id, 0, sampled)
        elif not link.span_id:  # it joined another process's trace: a span of that trace
            link = step.link = link._replace(span_id=new_ids(link.trace_id)[1])
        return link

    def _hang_link(self, t: int) -> StepLink | None:
        """The open step's link for a hang record: traced whatever the sampler says, its
        span's ids chosen now (hangs.py)."""
        link = self._own_link(t)
        step = self._current
        if link is not None and step is not None and not link.hang:
            link = step.link = link._replace(sampled=True, hang=True)
        return link

    def _link_at(self, parent: tuple[Any, ...]) -> None:
        """The open step joins the trace ``parent`` (links.Parent's fields) names, as a
        child of its span, if sampled there; the first link of a step stands."""
        step = self._current
        if step is not None and step.link is None and parent[2]:
            step.link = StepLink.under(Parent(*parent))
