"""The public API: the functions and names ``import otel_train`` offers.

``otel_train/__init__.py`` names them and loads this module at their first use, so that
importing the package alone (as the sidecar's ``python -m otel_train.sidecar`` does)
imports neither this nor torch. Usage: the package's docstring and README.md.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from . import session
from .adapters import Instrumentation, kind_of, select
from .recording.links import UNSET
from .recording.recorder import PhaseScope, Recorder, RemotePhaseScope, StepScope
from .recording.regions import RegionLog


def configure(
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    logger_provider: Any = None,
    **settings: Any,
) -> session.Session:
    """Start (or return) the process's telemetry session with these settings
    (``logger_provider``: where hang records go with your own providers; default: the
    global one)."""
    return session.get_or_create(
        settings,
        tracer_provider,
        meter_provider,
        origin="otel_train.configure()",
        logger_provider=logger_provider,
    )


def instrument(
    target: Any,
    *,
    optimizer: Any = None,
    dataloader: Any = None,
    phases: Any = None,
    step: Any = None,
    count_batch: Any = None,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    logger_provider: Any = None,
    **settings: Any,
) -> Instrumentation:
    """Instrument a training target; returns a handle (also a context manager).

    ``optimizer=`` and ``dataloader=`` (plain loops): a step ends at the optimizer's step,
    or without an optimizer at the next batch fetch. ``phases=`` and ``step=``: an object
    whose methods are the phases (RL loops). ``count_batch=fn``: ``fn(batch)`` returns
    the batch's ``(samples, tokens)`` (either may be None), instead of the rule in
    ``otel_train/adapters/batches.py``. Providers given are used as they are; the other
    keywords are settings (docs/configuration.md); ``logger_provider``: where hang
    records go with your own providers (default: the global one).

    Raises TypeError for unsupported targets and ConfigError (a ValueError) for bad
    settings, before changing anything.
    """
    attach = select(
        target,
        optimizer=optimizer,
        dataloader=dataloader,
        phases=phases,
        step=step,
        count_batch=count_batch,
    )
    sess = session.get_or_create(
        settings,
        tracer_provider,
        meter_provider,
        origin="otel_train.instrument()",
        logger_provider=logger_provider,
    )
    existing = sess.instrumentations.get(id(target))
    if isinstance(existing, Instrumentation) and existing.active and existing.target is target:
        warnings.warn(
            f"otel_train.instrument(): {type(target).__name__} is already instrumented; "
            "returning the existing handle",
            RuntimeWarning,
            stacklevel=2,
        )
        return existing
    inst = Instrumentation(sess, target, kind_of(target, phases))
    try:
        attach(inst)
    except BaseException:
        inst.uninstrument()
        raise
    sess.instrumentations[id(target)] = inst
    sess.note_model(target)
    sess.instrumented(target)
    return inst


class _NullScope:
    __slots__ = ()

    def __enter__(self) -> _NullScope:
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        return False

    def produced(self, policy_version: int | None = None) -> dict[str, str]:
        return {}


_NULL = _NullScope()


def _recorder() -> Any:
    if session.forked_child:
        return None
    current = session.implicit()
    return None if current is None else current.recorder


def phase(name: str, parent: Any = UNSET) -> PhaseScope | RemotePhaseScope | _NullScope:
    """``with otel_train.phase("rollout"):`` marks a phase of the current step.

    ``parent=carrier`` (what :func:`carrier` returned in the trainer's process): a
    remote phase, timed and measured here and in this process's phase metrics, in no
    step of this process; when the carrier is sampled its span is a child of the
    trainer's step span, in that trace. A bad carrier (None, empty, malformed, from
    another run) gives one warning and the phase as if no ``parent=`` were given: a
    phase of the step open here, or outside any step one without a trace. ``with ... as
    rollout:`` then ``rollout.produced()`` after the block: the token the consuming
    step hands :func:`consumed` (its span, policy version and figures)."""
    rec: Recorder | None = _recorder()
    if rec is None:
        return _NULL
    return rec.phase(name) if parent is UNSET else rec.remote_phase(name, parent)


def step(
    samples: int | None = None, tokens: int | None = None, parent: Any = UNSET
) -> StepScope | _NullScope:
    """``with otel_train.step(samples=..., tokens=...):`` marks one training step.

    ``parent=carrier``: the step's span joins that trace, a child of the other
    process's step span, when the carrier is sampled (else it is a trace of its own)."""
    rec = _recorder()
    return _NULL if rec is None else rec.step(samples, tokens, parent)


def carrier(policy_version: int | None = None) -> dict[str, str]:
    """The W3C trace context of the step open now, for another process's
    ``otel_train.phase(name, parent=...)`` (or ``step(parent=...)``).

    A small dict of strings (send it through a queue, a pipe, an RPC; any OTel
    propagator reads it too): ``traceparent`` names this step's span and says whether
    the trace is kept, ``baggage`` holds the step index, the run id and
    ``policy_version`` if given. Empty when no step is open. The first carrier and then
    at most one per ``trace_window_seconds`` are sampled (every one with
    ``trace_steps="all"``, none with ``"none"``): this step then becomes a trace, and
    the remote phases under it export spans; under the others they feed metrics only."""
    current = session.current()
    if current is None or current.closed or session.forked_child:
        return {}
    current.start_exports()  # (whether a carrier is sampled depends on them)
    return current.recorder.carrier(policy_version)


def consumed(token: Any, policy_version: int | None = None) -> None:
    """The step open now consumed a rollout: ``token`` is what the generator's
    ``phase(name, parent=carrier).produced()`` returned (sent back with the rollout).

    The step's span gets a span link to the rollout's span (when its carrier was
    sampled; the step is then traced), ``policy_version - k`` (k: the rollout's policy
    version) goes to the ``otel_train.policy.staleness`` histogram, and the rollout's
    host seconds and peak memory from the generator show in this process's console
    table and run summary as a row ``rollout [generator]``. At most 128 tokens a step;
    a bad token (or one outside a step) warns once, never raises."""
    rec = _recorder()
    if rec is not None:
        rec.consumed(token, policy_version)


def region(kind: str) -> Any:
    """``with otel_train.region("evaluation"):`` (or ``"checkpoint"``) marks time outside
    training steps for the goodput breakdown; anything else outside steps counts as other."""
    if session.forked_child:
        return _NULL
    current = session.implicit()
    if current is None:
        return RegionLog().region(kind)  # checks the kind; times into a log nobody reads
    return current.regions.region(kind)


def flush(timeout: float = 5.0) -> bool:
    """Make every finished step visible to the providers now: metrics current, spans
    exported (to the sidecar's exporters, or to the providers you passed). Bounded by
    ``timeout`` seconds; True when all of it was done in time. Training goes on meanwhile
    on other threads; the calling thread waits."""
    current = session.current()
    if current is None or session.forked_child:
        return True
    return current.flush(timeout)


def record(**scalars: Any) -> None:
    """Record user scalars (loss=..., reward=...); CUDA tensors are read without a sync."""
    rec = _recorder()
    if rec is not None:
        rec.record_scalars(scalars)


def shutdown(timeout: float | None = None) -> bool:
    """Uninstrument, flush and close within ``timeout`` seconds (default: shutdown_timeout).

    Returns False when the deadline cut the flush short (the Collector down, say): what
    was left is dropped and the exporters are stopped, so nothing runs on afterwards.
    """
    return session.shutdown(timeout)
