"""otel-train: OpenTelemetry-native telemetry for PyTorch training.

Usage::

    import otel_train

    inst = otel_train.instrument(model, optimizer=opt, dataloader=loader)
    for batch in loader:
        ...                       # data / forward / backward / optimizer become phases
    otel_train.shutdown()         # flush with a deadline (also runs at exit)

    with otel_train.step(samples=64, tokens=64 * 512):
        with otel_train.phase("rollout"):
            ...
    otel_train.record(loss=loss, reward=reward)

Layers: each part imports only what its arrow names, plus the foundation (identity,
contract, settings); tests/unit/test_layering.py holds the same table and finds cycles,
annotation-only imports counted too::

    otel_train (this package) ─► api, session, adapters (each name loaded at its first use:
                                 `import otel_train` alone imports nothing more)
    api (the public functions) ─► session, adapters, recording
    cli ─► otel_train, runs      testing ─► session, export
    instrumentor ─► otel_train, session, adapters   (opentelemetry-instrument's entry point)
    runs ─► export, processing   (reads run records: replay, report, timeline)
    session ─► handover, wiring, export, processing, recording, debug, signals, session_end
    session_end ─► nothing      (a session's flush and end, handed the session)
    handover ─► wiring, export, processing, recording (the training process's end of the
                                 sidecar; starts it as a process, never imports it)
    sidecar ─► handover (its wire.py), wiring, export, processing, recording (a process
                                 of its own: python -m otel_train.sidecar; imported by none)
    wiring ─► export, processing (the consumer side built: in a thread or in the sidecar)
    adapters ─► recording        (base, backward, batches, collectives, ddp: never each other)
    (session and adapters never import each other: each names what it uses of the other
    in a Protocol of its own, session.Instrumented and adapters/base.py's SessionView)
    export ─► processing         (the SDK side, reading the consumer side's aggregates)
    processing ─► recording      (the core's consumer side: the source takes finished steps
                                 and recognised runs off the recorder and resolves them;
                                 blocks, metrics, sampling, tables, spans, the hang watch)
    recording ─► debug           (the core's training-thread side: hooks, the log and
                                 the shared-memory ring a raw hand-over's hooks write
                                 (ring.py, its writer in C: _ring.c), the state machine,
                                 CUDA events; imports no consumer type)
    debug ─► identity only       (loads without the rest of otel-train)
    signals ─► the foundation; contract, settings ─► each other, identity ─► nothing

Processes and threads, and the code each runs (the default: the sidecar with otel-train's
own SDK; docs/rationale.md, "Where the work runs", has the bounds of each hand-over)::

    training process
      training thread     the hooks (adapters/, recording/): one ring slot a boundary in a
                          raw session (the C writer), else one log entry; with the device
                          timed, also its stamp (an event, an allocator read)
      otel-train-feeder   (handover/feeder.py, raw.py, event_times.py) every 100 ms: the
                          ring's news and the sidecar's requests; with the device timed,
                          the ring's events resolved in order, their times told; between
                          raw sessions, finished steps sent; hang progress
      otel-train-relay    (handover/relay_in.py) your providers only: what the sidecar made
      signal handler      (signals.py, the main thread) SIGTERM's bounded flush
    sidecar process       (python -m otel_train.sidecar: sidecar/agent.py, replica.py)
      main                the pipe and the ring; the replica recorder applies ring slots
      otel-train-worker   (processing/) metrics, console, sampling, spans
      SDK threads         (export/) OTLP, the run record, /metrics
    with sidecar="off" (or no sidecar): the sidecar's threads run in the training process
    (the worker replays the log itself), fed by the same recorder without the ring
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

__all__ = [
    "ConfigError",
    "Instrumentation",
    "Settings",
    "__version__",
    "carrier",
    "configure",
    "consumed",
    "contract",
    "flush",
    "instrument",
    "phase",
    "record",
    "region",
    "shutdown",
    "step",
]

if TYPE_CHECKING:
    from . import contract
    from .adapters import Instrumentation
    from .api import (
        carrier,
        configure,
        consumed,
        flush,
        instrument,
        phase,
        record,
        region,
        shutdown,
        step,
    )
    from .session import __version__
    from .settings import ConfigError, Settings
else:
    # Where each name of the API lives (the functions: api.py), imported at its first use.
    _HOMES = {
        "ConfigError": "settings",
        "Settings": "settings",
        "Instrumentation": "adapters",
        "__version__": "session",
    }
    _API = frozenset(__all__) - {"contract"}  # (contract: a module)

    def __getattr__(name: str) -> object:
        """A name of the API, imported at its first use, or a module of the package:
        ``import otel_train`` alone imports nothing more, so the sidecar (``python -m
        otel_train.sidecar``, which imports this package first) imports neither the
        training side nor torch. Once loaded, a name is this module's own attribute:
        later uses never come here."""
        if name in _API:
            home = importlib.import_module(f"{__name__}.{_HOMES.get(name, 'api')}")
            value = globals()[name] = getattr(home, name)
            return value
        if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}"):
            return importlib.import_module(f"{__name__}.{name}")  # (as `import` would)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))  # (the API before it is loaded too)
