"""otel-train as an OpenTelemetry instrumentation: ``opentelemetry-instrument python
train.py`` runs an unmodified training script with otel-train's steps, phases and metrics
(``pip install 'otel-train[auto]'``).

The entry point ``otel_train`` of the ``opentelemetry_instrumentor`` group (pyproject.toml)
is :class:`OtelTrainInstrumentor`; ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=otel_train``
turns it off. Its ``instrument()`` imports nothing heavy: when ``torch`` is imported it
installs the process-wide hooks of adapters/process_wide.py (a plain loop: optimizer
steps, DataLoader iteration, backward, the first module call), and when a Hugging Face
or Lightning ``Trainer`` class is imported it wraps ``Trainer.train`` / ``Trainer.fit`` so
that each trainer is instrumented (``otel_train.instrument(trainer)``, the adapters of
adapters/hf.py and adapters/lightning.py) when its training begins, unless the script
instrumented it itself. Construction is where a trainer becomes known, but attaching
then would start the session before the script's own ``configure()`` /
``instrument()`` with other settings could run; its ``train()`` is the same trainer
without that conflict.

The session starts at the first hook that fires, with the settings of the environment
(``OTEL_TRAIN_*``) and the providers ``opentelemetry-instrument`` configured (the global
ones; or ``instrument(tracer_provider=..., meter_provider=...)``). A script that calls
``otel_train.configure()`` or ``instrument()`` before training keeps its own settings,
and the process-wide hooks stand aside while the session has instrumentations: one
instrumentation, never two. ``uninstrument()`` restores torch and the trainer classes and
uninstruments the trainers it instrumented.
"""

from __future__ import annotations

import atexit
import functools
import logging
import sys
from collections.abc import Callable, Collection
from typing import Any

import wrapt

# (its module is marked untyped: mypy sees no BaseInstrumentor in it)
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

ENTRY_POINT = "otel_train"  # the name OTEL_PYTHON_DISABLED_INSTRUMENTATIONS takes
ORIGIN = "the otel_train instrumentor (opentelemetry-instrument)"
# Module that defines a Trainer -> the method whose call starts its training.
TRAINERS = {
    "transformers.trainer": "train",
    "lightning.pytorch.trainer.trainer": "fit",
    "pytorch_lightning.trainer.trainer": "fit",
}
_log = logging.getLogger("otel_train")


class OtelTrainInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """``OtelTrainInstrumentor().instrument()``: what ``opentelemetry-instrument`` calls."""

    _generation = 0  # post-import hooks of an earlier instrument() do nothing

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("torch >= 2.4",)

    def _instrument(self, **kwargs: Any) -> None:
        self._providers = (kwargs.get("tracer_provider"), kwargs.get("meter_provider"))
        self._undo: list[Callable[[], None]] = []
        self._trainers: list[Any] = []  # the Instrumentations it made
        OtelTrainInstrumentor._generation += 1
        # Registered after opentelemetry-instrument built the SDK, so it runs before the
        # providers' own exit handlers: the last steps reach them before they shut down.
        atexit.register(_shutdown)
        self._undo.append(lambda: atexit.unregister(_shutdown))
        _when_imported("torch", self._torch_imported)
        for module, method in TRAINERS.items():
            _when_imported(module, functools.partial(self._trainer_imported, method=method))

    def _uninstrument(self, **kwargs: Any) -> None:
        OtelTrainInstrumentor._generation += 1
        for inst in self._trainers:
            inst.uninstrument()
        self._trainers.clear()
        while self._undo:
            self._undo.pop()()

    # -- what the post-import hooks install ----------------------------------------------

    def _torch_imported(self, _torch: Any) -> None:
        from .adapters.process_wide import ProcessWideHooks

        hooks = ProcessWideHooks(lambda: self._process_wide(hooks))
        hooks.install()
        self._undo.append(hooks.uninstall)

    def _trainer_imported(self, module: Any, method: str) -> None:
        from .adapters.process_wide import wrap_entry

        cls = getattr(module, "Trainer", None)
        if isinstance(cls, type) and callable(getattr(cls, method, None)):
            self._undo.append(wrap_entry(cls, method, self._trainer_starts))

    # -- what the hooks call -------------------------------------------------------------

    def _session(self) -> Any:
        """The live session, started now with the environment's settings if there is none;
        None after ``otel_train.shutdown()`` and in forked children."""
        from . import session

        if session.forked_child:
            return None
        live = session.current()
        if live is not None and not live.closed:
            return live
        if session.stopped():
            return None
        tracer_provider, meter_provider = self._providers
        return session.get_or_create({}, tracer_provider, meter_provider, origin=ORIGIN)

    def _process_wide(self, target: Any) -> Any:
        from .adapters.base import Instrumentation

        sess = self._session()
        if sess is None:
            return None
        sess.instrumented(target)  # its first step becomes a trace
        return Instrumentation(sess, target, "process-wide")

    def _trainer_starts(self, trainer: Any) -> None:
        import otel_train

        sess = self._session()
        if sess is None:
            return
        existing = sess.instrumentations.get(id(trainer))
        if existing is not None and existing.target is trainer:
            return  # the script instrumented it: that one instrumentation
        self._trainers.append(otel_train.instrument(trainer))


def _shutdown() -> None:
    session = sys.modules.get(f"{__package__}.session")
    if session is None:  # never started here (a DataLoader worker, say): nothing to end,
        return  # and importing it at exit would build an SDK provider after shutdown
    session.shutdown()


def _when_imported(name: str, install: Callable[[Any], None]) -> None:
    """``install(module)`` once ``name`` is imported (now, if it is); an error is logged."""
    generation = OtelTrainInstrumentor._generation

    def hook(module: Any) -> None:
        if generation != OtelTrainInstrumentor._generation:
            return  # uninstrumented since
        try:
            install(module)
        except Exception:
            _log.exception("otel-train: instrumenting %s failed", name)

    if name in sys.modules:
        hook(sys.modules[name])
    else:
        wrapt.register_post_import_hook(hook, name)


__all__ = ["ENTRY_POINT", "OtelTrainInstrumentor"]
