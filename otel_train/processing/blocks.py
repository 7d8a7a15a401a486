"""Finished steps as columns: the one batch type that metrics, the console, the
efficiency figures and the trace sampler read.

A :class:`StepBlock` holds ``k`` consecutive finished steps of one :class:`Shape` (their
phases' names, nesting and clock, in seq order), as lists with one item per step. Two
producers make them, and every consumer has one implementation for both:

- the recorder's recognised steps (:mod:`.blocks`): a run of identical adapter steps,
  whose columns come straight from the log entries' times (no object per step);
- resolved steps (:mod:`.source`: replayed from the log, or with CUDA events resolved):
  :func:`group_steps` puts consecutive steps of one shape in one block, so a step whose
  shape repeats nowhere is a block of one.

Only the steps chosen for traces become :class:`~..recording.layouts.Step` objects
again (:meth:`StepBlock.step`).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter, sub
from typing import Any

from ..recording.collectives import Waits
from ..recording.layouts import (
    L_PADDED,
    L_SAMPLES,
    L_SCALARS,
    L_TIME,
    L_TOKENS,
    P_EV0,
    P_MEMORY,
    P_NAME,
    P_PARENT,
    P_SECONDS,
    P_SEQ,
    Step,
)
from ..recording.templates import Run, Template
from ..recording.values import add_count
from .resolved import finished_step, scalar_value

MAX_SHAPES = 256  # shapes of resolved steps kept for reuse (a bounded cache)
_TIME = itemgetter(L_TIME)
_SAMPLES = itemgetter(L_SAMPLES)
_TOKENS = itemgetter(L_TOKENS)
_PADDED = itemgetter(L_PADDED)
Column = list[int | None]  # one count per step of a block
# Each recognised shape's Shape, made at its first block (weakly: a template goes when
# its recorder or the sidecar's table lets it go)
_TEMPLATE_SHAPES: weakref.WeakKeyDictionary[Template, Shape] = weakref.WeakKeyDictionary()


class Shape:
    """The phases of a step, in seq order: per row its seq, parent, name, depth and
    whether CUDA events timed it (``devices``)."""

    __slots__ = ("data_rows", "depths", "devices", "key", "names", "parents", "seqs", "waits")

    def __init__(
        self, rows: Sequence[tuple[int, int, str]], devices: Sequence[bool] | None = None
    ) -> None:
        self.seqs = [seq for seq, _, _ in rows]
        self.parents = [parent for _, parent, _ in rows]
        self.names = [name for _, _, name in rows]
        self.devices = list(devices) if devices is not None else [False] * len(rows)
        # Equal for equal shapes, whichever producer made them (sampling.py's new shapes).
        self.key = (tuple(self.seqs), tuple(self.parents), tuple(self.names), tuple(self.devices))
        depth: dict[int, int] = {}
        for seq, parent, _ in rows:  # (a parent not among the rows counts as depth 0)
            depth[seq] = depth.get(parent, 0) + 1 if parent >= 0 else 0
        self.depths = [depth[seq] for seq in self.seqs]
        # Top-level "data" phases: the step's data-loading wait (efficiency.py).
        self.data_rows = [
            i for i, (_, parent, name) in enumerate(rows) if parent < 0 and name == "data"
        ]
        # Collectives' rows and the rows they ran in (collectives.py).
        self.waits = Waits(self.seqs, self.parents, self.names)


@dataclass(slots=True)  # one per traced step: a frozen dataclass costs ~1 us to build
class StepEfficiency:
    flops: float | None
    source: str  # counted / scaled / given / estimate, "" when unknown
    flops_per_s: float | None
    mfu: float | None
    data_share: float
    counted: bool


class EfficiencyColumns:
    """What efficiency.py worked out for a block's steps, one item per step: FLOPs and
    how they were found, whether the step was the counted one, and the FLOPs and
    seconds that enter the achieved rate (0.0 for a step without a rate)."""

    __slots__ = ("counted", "flops", "peak_flops_per_s", "rate_flops", "rate_seconds", "source")

    def __init__(
        self,
        flops: list[float | None],
        source: list[str],
        counted: list[bool],
        rate_flops: list[float],
        rate_seconds: list[float],
        peak_flops_per_s: float | None,
    ) -> None:
        self.flops, self.source, self.counted = flops, source, counted
        self.rate_flops, self.rate_seconds = rate_flops, rate_seconds
        self.peak_flops_per_s = peak_flops_per_s

    def of_step(self, block: StepBlock, i: int) -> StepEfficiency:
        """Step ``i``'s figures, as a span carries them."""
        seconds, rated = block.seconds[i], self.rate_seconds[i]
        rate = mfu = None
        if rated > 0:
            rate = self.rate_flops[i] / rated
            if self.peak_flops_per_s is not None:
                mfu = rate / self.peak_flops_per_s
        data = block.data_seconds()[i]
        return StepEfficiency(self.flops[i], self.source[i], rate, mfu,
                              data / seconds if seconds > 0 else 0.0, self.counted[i])  # fmt: skip


class StepBlock:
    """``k`` consecutive finished steps of one shape, indices ``first`` .. ``first+k-1``.

    Columns (one item per step): ``starts``/``ends`` (host ns), ``seconds`` (host step
    seconds), ``samples``/``tokens``/``padded`` (None where unknown; ``padded``: tokens
    padding included, adapters/batches.py), ``scalars`` (each step's, or
    None when no step has any), ``durations`` (span extent in ns, device times included),
    ``device_seconds`` (None for a host-only block), ``errors`` (offsets of steps that
    raised), ``linked`` (offsets of steps in a sampled trace across processes, links.py,
    or linking to a sampled rollout, tokens.py), ``consumed`` (offsets of steps that
    consumed rollouts; a recognised step is in neither), ``debug`` (offsets of steps
    whose spans carry a debugging component's event). Per phase row of the shape:
    ``phase_seconds[r]`` (device seconds where measured) and ``memory[r]`` (None when no
    row has memory figures).
    """

    __slots__ = (
        "_data",
        "_entries",
        "_steps",
        "_times",
        "consumed",
        "debug",
        "device_seconds",
        "durations",
        "efficiency",
        "ends",
        "errors",
        "first",
        "k",
        "linked",
        "memory",
        "padded",
        "phase_seconds",
        "samples",
        "scalars",
        "seconds",
        "shape",
        "starts",
        "template",
        "tokens",
    )  # fmt: skip
    _times: list[int]  # a recognised block's entry times (take_raw)
    samples: Column
    tokens: Column
    padded: Column
    scalars: list[list[tuple[str, float]]] | None

    def __init__(
        self,
        shape: Shape,
        first: int,
        k: int,
        template: Template | None = None,
        entries: list[tuple[Any, ...]] | None = None,
    ) -> None:
        """``k`` steps of ``shape`` from index ``first``: a run of recognised steps
        (``template``, its k * m log entries; the columns come later, off the recorder's
        lock: :meth:`columns`), or resolved steps (:meth:`of_steps`)."""
        self.template = template
        self.shape = shape
        self._entries = entries if entries is not None else []
        self.first = first
        self.k = k
        self._steps: list[Step] | None = None
        self.efficiency: EfficiencyColumns | None = None  # set by the efficiency tracker
        self._data: list[float] | None = None
        self.memory: list[list[Any]] | None = None
        self.errors: list[int] = []
        self.linked: list[int] = []  # steps traced for their trace across processes
        self.consumed: list[int] = []  # steps that consumed rollouts (tokens.py)
        self.debug: list[int] = []  # steps with a debugging event (profiler, snapshot)
        self.device_seconds: list[float | None] | None = None

    @property
    def recognised(self) -> Template:
        """The shape of a block of recognised steps (what their columns derive from)."""
        assert self.template is not None, "a block of resolved steps has no template"
        return self.template

    @classmethod
    def of_run(cls, run: Run) -> StepBlock:
        """A run of recognised steps as the log held them (templates.Run)."""
        return cls(template_shape(run.template), run.first, run.k, run.template, run.entries)

    # -- resolved steps ------------------------------------------------------------------

    @classmethod
    def of_steps(cls, steps: list[Step], shape: Shape) -> StepBlock:
        """Consecutive resolved steps that all have ``shape``."""
        block = cls(shape, steps[0].index, len(steps))
        block._steps = steps
        block.starts = [s.t0 for s in steps]
        block.ends = [s.t1 for s in steps]
        block.seconds = [s.host_seconds for s in steps]
        block.samples = [s.samples for s in steps]
        block.tokens = [s.tokens for s in steps]
        block.padded = [s.padded for s in steps]
        block.durations = [s.end - s.start for s in steps]
        rows = [s.phases for s in steps]
        block.phase_seconds = [[r[i][P_SECONDS] for r in rows] for i in range(len(shape.names))]
        if any(row[P_MEMORY] is not None for r in rows for row in r):
            block.memory = [[r[i][P_MEMORY] for r in rows] for i in range(len(shape.names))]
        block.errors = [i for i, s in enumerate(steps) if s.error]
        block.linked = [i for i, s in enumerate(steps) if _linked(s)]
        block.consumed = [i for i, s in enumerate(steps) if s.consumed]
        block.debug = [i for i, s in enumerate(steps) if s.events]
        if any(s.device_seconds is not None for s in steps):
            block.device_seconds = [s.device_seconds for s in steps]
        block.scalars = [s.scalars or [] for s in steps] if any(s.scalars for s in steps) else None
        return block

    # -- recognised steps ----------------------------------------------------------------

    def columns(self) -> None:
        """Derive the columns (from the log entries, or from :meth:`from_raw`'s)."""
        if self._steps is not None:
            return
        self.take_raw()
        tpl = self.recognised
        m = tpl.m
        times = self._times
        starts = self.starts = times[tpl.start :: m]
        ends = self.ends = times[tpl.end :: m]
        # The recorder's own arithmetic, so each figure is the one the replay would give.
        self.seconds = [(b - a) / 1e9 if b > a else 0.0 for a, b in zip(starts, ends, strict=True)]
        self.durations = list(map(sub, ends, starts))  # host times only in a block
        self.phase_seconds = [
            [
                (b - a) / 1e9 if b > a else 0.0
                for a, b in zip(times[i0::m], times[i1::m], strict=True)
            ]
            for _, _, _, i0, i1 in tpl.rows
        ]

    def take_raw(self) -> tuple[list[int], Column, Column, Column, Any]:
        """What the columns derive from, in plain lists (the log entries are let go, on
        the first call): every entry's time, each step's samples, tokens, padded tokens
        and scalars."""
        if not self._entries:
            return self._times, self.samples, self.tokens, self.padded, self.scalars
        tpl = self.recognised
        m = tpl.m
        self._times = list(map(_TIME, self._entries))
        self.samples, self.tokens, self.padded = self._counts()
        # Each step's scalars, resolved as the worker resolves a replayed step's.
        self.scalars = None
        if tpl.scalars:
            per_step: list[list[tuple[str, float]]] = [[] for _ in range(self.k)]
            for p in tpl.scalars:
                for out, entry in zip(per_step, self._entries[p::m], strict=True):
                    out.extend(
                        (n, v)
                        for n, raw in entry[L_SCALARS]
                        if (v := scalar_value(raw)) is not None
                    )
            self.scalars = per_step
        self._entries = []
        return self._times, self.samples, self.tokens, self.padded, self.scalars

    @classmethod
    def from_raw(
        cls,
        template: Any,
        first: int,
        times: list[int],
        counts: tuple[Column, Column, Column],
        scalars: list[list[tuple[str, float]]] | None,
    ) -> StepBlock:
        """A block rebuilt from :meth:`take_raw`'s lists (in the sidecar's process);
        ``counts``: its samples, tokens and padded tokens columns."""
        block = cls(template_shape(template), first, template.steps_in(len(times)), template)
        block._times, block.scalars = times, scalars
        block.samples, block.tokens, block.padded = counts
        return block

    def last_end(self) -> int:
        """When the block's last step ended (host ns; a block from :meth:`from_raw`)."""
        tpl = self.recognised
        return int(self._times[(self.k - 1) * tpl.m + tpl.end])

    def _counts(self) -> tuple[Column, Column, Column]:
        tpl = self.recognised
        m = tpl.m
        if not tpl.counts:
            none: Column = [None] * self.k
            return none, list(none), list(none)
        c = tpl.counts[0]
        samples = list(map(_SAMPLES, self._entries[c::m]))
        tokens = list(map(_TOKENS, self._entries[c::m]))
        padded = list(map(_PADDED, self._entries[c::m]))
        for c in tpl.counts[1:]:  # several fetches per step (gradient accumulation)
            more = self._entries[c::m]
            samples = [add_count(a, e[L_SAMPLES]) for a, e in zip(samples, more, strict=True)]
            tokens = [add_count(a, e[L_TOKENS]) for a, e in zip(tokens, more, strict=True)]
            padded = [add_count(a, e[L_PADDED]) for a, e in zip(padded, more, strict=True)]
        return samples, tokens, padded

    # -- reading -------------------------------------------------------------------------

    def data_seconds(self) -> list[float]:
        """Each step's time in top-level ``data`` phases, summed as the replay's step is."""
        if self._data is not None:
            return self._data
        rows = self.shape.data_rows
        if not rows:
            out = [0.0] * self.k
        else:
            cols = [self.phase_seconds[i] for i in rows]
            out = [0.0 + v for v in cols[0]]
            for col in cols[1:]:
                out = [a + v for a, v in zip(out, col, strict=True)]
        self._data = out
        return out

    def wait_seconds(self) -> list[float]:
        """Each step's time waiting in collectives (its collectives' rows, summed)."""
        rows = self.shape.waits.rows
        out = [0.0] * self.k
        for i in rows:
            out = [a + v for a, v in zip(out, self.phase_seconds[i], strict=True)]
        return out

    def rate_seconds(self) -> list[float]:
        """The seconds a step's FLOP rate is taken over: device time when measured."""
        dev = self.device_seconds
        if dev is None:
            return self.seconds
        return [d if d else h for d, h in zip(dev, self.seconds, strict=True)]

    def step(self, i: int) -> Step:
        """Step ``first + i`` as the replay would have resolved it, with its efficiency
        figures when the tracker observed the block."""
        rs = self._steps[i] if self._steps is not None else self._built(i)
        if self.efficiency is not None:
            rs.efficiency = self.efficiency.of_step(self, i)
        return rs

    def _built(self, i: int) -> Step:
        tpl = self.recognised
        m = tpl.m
        rs = finished_step(self.first + i, self.starts[i], self.ends[i])
        rs.samples, rs.tokens, rs.padded = self.samples[i], self.tokens[i], self.padded[i]
        times = self._times
        base = i * m
        rs.phases = [
            (
                seq,
                parent,
                name,
                times[base + i0],
                times[base + i1],
                None,
                None,
                None,
                None,
                self.phase_seconds[r][i],
            )
            for r, (seq, parent, name, i0, i1) in enumerate(tpl.rows)
        ]
        if self.scalars is not None:
            rs.scalars = list(self.scalars[i])
        return rs


def group_steps(steps: list[Step], shapes: dict[Any, Shape]) -> list[StepBlock]:
    """Resolved steps as blocks: consecutive steps of one shape share a block.
    ``shapes``: the caller's cache of shapes by key (kept under :data:`MAX_SHAPES`)."""
    out: list[StepBlock] = []
    run: list[Step] = []
    key: Any = None
    for s in steps:
        k = tuple((r[P_SEQ], r[P_PARENT], r[P_NAME], r[P_EV0] is not None) for r in s.phases)
        if k != key and run:
            out.append(StepBlock.of_steps(run, _shape(shapes, key)))
            run = []
        key = k
        run.append(s)
    if run:
        out.append(StepBlock.of_steps(run, _shape(shapes, key)))
    return out


def template_shape(template: Template) -> Shape:
    """The Shape of a recognised step's template (made once per template)."""
    shape = _TEMPLATE_SHAPES.get(template)
    if shape is None:
        rows = [(seq, parent, name) for seq, parent, name, _, _ in template.rows]
        shape = _TEMPLATE_SHAPES[template] = Shape(rows)
    return shape


def _shape(shapes: dict[Any, Shape], key: Any) -> Shape:
    shape = shapes.get(key)
    if shape is None:
        if len(shapes) >= MAX_SHAPES:
            shapes.clear()
        rows = [(seq, parent, name) for seq, parent, name, _ in key]
        shape = shapes[key] = Shape(rows, [device for _, _, _, device in key])
    return shape


def _linked(step: Step) -> bool:
    """Whether a step is in a sampled trace across processes, or links to one's span."""
    if step.link is not None and step.link.sampled:
        return True
    return step.consumed is not None and any(x.sampled for x in step.consumed)
