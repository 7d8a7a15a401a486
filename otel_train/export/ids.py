"""Span ids chosen before the span exists: a carrier names a step span built later.

``otel_train.carrier()`` hands another process the trace and span ids of the step open
now (recording/links.py); that step's span is started after the step ends, in the
worker or the sidecar. The OTel API has no way to give a span its ids, so the SDK's id
generator is asked: :class:`ChosenIds` returns the ids the span emitter chose for the
next span it starts on its thread, and otherwise what the generator it wraps returns.
It sits only on otel-train's own tracer (one instrumentation scope), in otel-train's
providers and in an SDK tracer provider of the application alike, so no other span's
ids change.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.sdk.trace import Tracer
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator


class ChosenIds(IdGenerator):
    def __init__(self, inner: IdGenerator | None = None) -> None:
        self.inner = inner if inner is not None else RandomIdGenerator()
        self._next = threading.local()

    def choose(self, trace_id: int, span_id: int) -> None:
        """The next span this thread starts gets ``span_id`` (and ``trace_id``, if a root)."""
        self._next.ids = (trace_id, span_id)

    def clear(self) -> None:
        self._next.ids = None

    def generate_trace_id(self) -> int:
        ids = getattr(self._next, "ids", None)
        return ids[0] if ids is not None else self.inner.generate_trace_id()

    def generate_span_id(self) -> int:
        ids = getattr(self._next, "ids", None)
        if ids is None:
            return self.inner.generate_span_id()
        self._next.ids = None  # one span only
        return int(ids[1])

    def is_trace_id_random(self) -> bool:
        return self.inner.is_trace_id_random()  # (chosen ids are random: links.new_ids)


def id_choice(tracer: Any) -> ChosenIds | None:
    """``tracer``'s chooser, put in place on first use; None when the tracer is not the
    SDK's (its ids cannot be chosen: carriers are then not handed out)."""
    if not isinstance(tracer, Tracer):
        return None
    generator = tracer.id_generator
    if not isinstance(generator, ChosenIds):
        generator = tracer.id_generator = ChosenIds(generator)
    return generator
