"""Spans built after the fact from resolved steps, through the OTel API only.

Each sampled step becomes its own trace: a root ``otel_train.step`` span and one
child span per phase, with explicit start/end timestamps (Unix-epoch ns). A step in a
trace across processes (links.py) is that trace's root, with the ids its carrier named,
or a child of the other process's step span. Phases
with CUDA events carry device timestamps (see ``device.py`` for their meaning and
error); host-only phases and CPU runs carry host timestamps.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from .. import contract as c
from ..recording.collectives import PREFIX as COLLECTIVE
from ..recording.collectives import parse as parse_collective
from ..recording.layouts import (
    E_MESSAGE,
    E_OOM,
    E_SNAPSHOT,
    E_STACK,
    E_TYPE,
    M_RESERVED,
    P_NAME,
    P_PARENT,
    P_SECONDS,
    P_SEQ,
    Step,
)
from .efficiency_lines import span_attributes
from .resolved import row_extent

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
# A collective's wait becomes a span of its own from this long (collectives.py); shorter
# ones are only their phase's otel_train.phase.collective_wait (docs/rationale.md).
COLLECTIVE_SPAN_S = 0.001
Pieces = Generator[None, None, "tuple[int, int] | None"]  # a trace, a span's start or end at a time


class IdChoice(Protocol):
    """The ids of the next span this thread starts, chosen by the caller (export/ids.py)."""

    def choose(self, trace_id: int, span_id: int) -> None: ...

    def clear(self) -> None: ...


class SpanEmitter:
    def __init__(
        self,
        tracer: trace.Tracer,
        rank: int,
        offset_ns: int,
        ids: IdChoice | None = None,
    ) -> None:
        """``ids``: how a step span gets the ids a carrier named (links.py), if the
        tracer can."""
        self._tracer = tracer
        self.ids = ids
        self._rank = rank
        self.offset_ns = offset_ns  # perf_counter_ns -> epoch ns
        self.emitted = 0
        self.device_total: int | None = None  # bytes, set once CUDA memory tracking starts

    def emit(self, step: Step) -> tuple[int, int] | None:
        """Emit the step's trace; returns (trace_id, step span_id) for exemplars."""
        return finish(self.pieces(step))

    def emit_remote(self, tree: Step) -> tuple[int, int] | None:
        """Emit a remote phase's tree (links.py) under the span its carrier named, if
        sampled there; returns (trace_id, outermost phase's span_id) for exemplars."""
        return finish(self.remote_pieces(tree))

    def pieces(self, step: Step) -> Pieces:
        """``emit`` one span's start or end at a time (each ``next`` is one: the relay
        hands them to an application's SDK between its training thread's steps)."""
        off = self.offset_ns
        host_s = step.host_seconds
        attrs: dict[str, Any] = {
            c.STEP_INDEX.key: step.index,
            c.RANK.key: self._rank,
            c.STEP_HOST_DURATION.key: host_s,
            c.STEP_SAMPLED_BECAUSE.key: step.sampled_because,
        }
        if step.samples is not None:
            attrs[c.STEP_SAMPLES.key] = step.samples
            if host_s > 0:
                attrs[c.STEP_THROUGHPUT_SAMPLES.key] = step.samples / host_s
        if step.tokens is not None:
            attrs[c.STEP_TOKENS.key] = step.tokens
            if host_s > 0:
                attrs[c.STEP_THROUGHPUT_TOKENS.key] = step.tokens / host_s
        dev = step.device_seconds
        if dev is not None:
            attrs[c.STEP_DEVICE_DURATION.key] = dev
        if step.efficiency is not None:
            span_attributes(step.efficiency, attrs)
        start = step.start + off
        end = max(step.end + off, start)
        wait = sum(r[P_SECONDS] for r in step.phases if r[P_NAME].startswith(COLLECTIVE))
        if wait > 0:
            attrs[c.STEP_COLLECTIVE_WAIT.key] = wait
        root = self._root(step, attrs, start)
        yield
        spans = yield from self._phase_tree(step.phases, root, step.index)
        if step.events:  # (profiler trace, memory snapshot paths: layouts.Step.events)
            for name, attributes in step.events:
                root.add_event(name, attributes, timestamp=start)
        if step.error:
            root.set_status(Status(StatusCode.ERROR, "a phase raised"))
        root.end(end_time=end)
        self.emitted += 1 + len(spans)
        ctx = root.get_span_context()
        return ctx.trace_id, ctx.span_id

    def remote_pieces(self, tree: Step) -> Pieces:
        """``emit_remote`` one span's start or end at a time."""
        link = tree.link
        if link is None or not link.sampled or not tree.phases:
            return None
        remote = SpanContext(link.trace_id, link.parent_id, is_remote=True, trace_flags=_SAMPLED)
        spans = yield from self._phase_tree(
            tree.phases,
            NonRecordingSpan(remote),
            link.step_index,
            link.policy_version,
            # (the outermost phase's span gets the id its token names: tokens.py)
            chosen=(link.trace_id, link.span_id) if link.span_id else None,
        )
        self.emitted += len(spans)
        ctx = spans[tree.phases[0][P_SEQ]].get_span_context()
        return ctx.trace_id, ctx.span_id

    def _phase_tree(
        self,
        phases: list[tuple[Any, ...]],
        root: Any,
        index: int | None,
        policy_version: int | None = None,
        chosen: tuple[int, int] | None = None,
    ) -> Generator[None, None, dict[int, Any]]:
        """One span per phase row under ``root`` (nested phases nest), ended, one start
        or end a piece; ``chosen``: the ids of the first span (``ids``)."""
        off = self.offset_ns
        spans: dict[int, Any] = {}
        waits = _waits(phases)
        for row in phases:  # sorted by seq: parents come before children
            if waits and row[P_NAME].startswith(COLLECTIVE) and row[P_SECONDS] < COLLECTIVE_SPAN_S:
                continue  # a short wait: only its parent's collective_wait attribute
            parent = spans.get(row[P_PARENT], root)
            span = self._phase_span(row, parent, index, policy_version, chosen)
            chosen = None
            seq = row[P_SEQ]
            if waits and seq in waits:
                span.set_attribute(c.PHASE_COLLECTIVE_WAIT.key, waits[seq])
            spans[seq] = span
            yield
        # End children before parents so exporters see a complete tree in order.
        for row in reversed(phases):
            span = spans.get(row[P_SEQ])
            if span is not None:
                start, end = row_extent(row)
                span.end(end_time=max(end, start) + off)
                yield
        return spans

    def _root(self, step: Step, attrs: dict[str, Any], start: int) -> Any:
        """The step's span: the root of a trace of its own (with the ids a carrier it
        handed out named), or a child of the other process's span its parent named
        (links.py)."""
        link = step.link
        context = otel_context.Context()
        chosen = None
        if link is not None:
            if link.parent_id:
                parent = SpanContext(
                    link.trace_id, link.parent_id, is_remote=True, trace_flags=_SAMPLED
                )
                context = trace.set_span_in_context(NonRecordingSpan(parent), context)
            if link.span_id:
                chosen = (link.trace_id, link.span_id)
        return self._start_span(
            chosen,
            c.STEP_SPAN.name,
            context=context,
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            links=_links(step.consumed) if step.consumed else None,
            start_time=start,
        )

    def _start_span(self, chosen: tuple[int, int] | None, name: str, **kwargs: Any) -> Any:
        """The tracer's ``start_span``, the span getting the ``chosen`` (trace, span) ids
        if the tracer can (``ids``); chosen and started in one call, so that a trace
        handed over in pieces (``pieces``) may go on on another thread."""
        ids = self.ids if chosen is not None else None
        if ids is not None and chosen is not None:
            ids.choose(*chosen)
        try:
            return self._tracer.start_span(name, **kwargs)
        finally:
            if ids is not None:
                ids.clear()

    def _phase_span(
        self,
        row: tuple[Any, ...],
        parent: Any,
        index: int | None,
        policy_version: int | None,
        chosen: tuple[int, int] | None,
    ) -> Any:
        _, _, name, t0, t1, d0, d1, memory, error, _ = row
        on_device = d0 is not None  # (placed device times: resolved.py)
        attrs: dict[str, Any] = {
            c.PHASE_CLOCK.key: "device" if on_device else "host",
            c.PHASE_HOST_DURATION.key: max(0, t1 - t0) / 1e9,
        }
        collective = parse_collective(name)
        if collective is not None:  # named after its op, with its op and group
            name = collective[0]
            attrs[c.COLLECTIVE_OP.key], attrs[c.COLLECTIVE_GROUP.key] = collective
        attrs[c.PHASE_NAME.key] = name
        if index is not None:  # (a remote phase's: the trainer's step, when its carrier says)
            attrs[c.STEP_INDEX.key] = index
        if policy_version is not None:
            attrs[c.POLICY_VERSION.key] = policy_version
        if on_device:
            attrs[c.PHASE_DEVICE_DURATION.key] = max(0, d1 - d0) / 1e9
        if memory is not None:
            peak_alloc, peak_res, retries, ooms = memory
            attrs[c.PHASE_PEAK_ALLOCATED.key] = peak_alloc
            attrs[c.PHASE_PEAK_RESERVED.key] = peak_res
            attrs[c.PHASE_ALLOC_RETRIES.key] = retries
            attrs[c.PHASE_OOMS.key] = ooms
        if memory is not None and self.device_total:
            attrs[c.PHASE_PEAK_UTILIZATION.key] = memory[M_RESERVED] / self.device_total
        span = self._start_span(
            chosen,
            name,
            context=trace.set_span_in_context(parent),
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            start_time=row_extent(row)[0] + self.offset_ns,
        )
        if error is not None:
            self._error_events(span, error, t1)
        return span

    def _error_events(self, span: Any, error: tuple[Any, ...], host_end: int) -> None:
        """A phase that raised (its described error, layouts.E_TYPE ...): the exception,
        the OOM figures, the OOM snapshot's path."""
        type_name, message, oom = error[E_TYPE], error[E_MESSAGE], error[E_OOM]
        at = host_end + self.offset_ns
        span.add_event(
            "exception",
            {"exception.type": type_name, "exception.message": message,
             "exception.stacktrace": error[E_STACK]},
            timestamp=at,
        )  # fmt: skip
        if oom is not None:
            allocated, reserved, total = oom
            span.add_event(
                c.OOM_EVENT,
                {
                    c.OOM_EVENT_ATTRIBUTES[0].key: allocated,
                    c.OOM_EVENT_ATTRIBUTES[1].key: reserved,
                    c.OOM_EVENT_ATTRIBUTES[2].key: total,
                },
                timestamp=at,
            )
        snapshot = error[E_SNAPSHOT] if len(error) > E_SNAPSHOT else None
        if snapshot:
            span.add_event(
                c.MEMORY_SNAPSHOT_EVENT,
                {c.MEMORY_SNAPSHOT_PATH.key: snapshot, c.MEMORY_SNAPSHOT_REASON.key: "oom"},
                timestamp=at,
            )
        span.set_status(Status(StatusCode.ERROR, f"{type_name}: {message}"[:256]))


def finish(pieces: Pieces) -> tuple[int, int] | None:
    """Every piece of ``pieces`` now; what it returns."""
    try:
        while True:
            next(pieces)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _waits(phases: list[tuple[Any, ...]]) -> dict[int, float]:
    """Seconds each phase waited in the collectives directly inside it, by its seq."""
    out: dict[int, float] = {}
    for row in phases:
        if row[P_NAME].startswith(COLLECTIVE):
            parent = row[P_PARENT]
            out[parent] = out.get(parent, 0.0) + row[P_SECONDS]
    return out


def _links(consumed: list[Any]) -> list[trace.Link]:
    """A consuming step's links: one per consumed rollout whose span exists (tokens.py)."""
    out = []
    for x in consumed:
        if not x.sampled or not x.trace_id:
            continue
        attrs: dict[str, Any] = {c.PHASE_NAME.key: x.name}
        if x.policy_version is not None:
            attrs[c.POLICY_VERSION.key] = x.policy_version
        if x.staleness is not None:
            attrs[c.LINK_STALENESS.key] = x.staleness
        if x.seconds is not None:
            attrs[c.PHASE_HOST_DURATION.key] = x.seconds
        ctx = SpanContext(x.trace_id, x.span_id, is_remote=True, trace_flags=_SAMPLED)
        out.append(trace.Link(ctx, attrs))
    return out
