"""Runs of identical adapter steps, handed to the worker as columns instead of objects.

A plain loop logs the same boundaries in the same order every step (fetch a batch,
forward, backward, optimizer step), each a constant from ``recorder.boundary()``. The
first time a run of boundaries takes an idle recorder through exactly one step and back
to idle, the run is replayed on a scratch recorder with each entry's position standing in
for its time. What comes out is the step's shape, a :class:`Template`: which entries
open and close the step, each phase's entries with its seq and parent, and where the
batch's counts land. It is a function of the boundaries alone (the state machine reads
nothing else on this path), so any later run of the same boundary objects, from the same
thread, from an idle recorder, gives the same shape with other times.

The worker then takes k such steps as one :class:`StepBlock`: their times and counts in
lists, with no ``OpenStep``, phase tuple or ``ResolvedStep`` built per step. Metrics,
throughput, efficiency figures, the console and the trace sampler read the columns; only
the steps chosen for traces are built as ``ResolvedStep`` objects
(:meth:`StepBlock.step`). Anything else in the log (an explicit phase, scalars, an
exception, another thread's boundary, the end of an epoch) goes through the ordinary
replay, and the recognition starts again at the next idle point.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

from .resolved import ResolvedStep, scalar_value

MAX_TEMPLATE = 64  # entries a step may log to be recognised
MAX_TEMPLATES = 8  # shapes kept per first boundary
KIND = itemgetter(2)
STACK = itemgetter(0)
_TIME = itemgetter(1)
_SAMPLES = itemgetter(3)
_TOKENS = itemgetter(4)


class Template:
    """One step's shape, in entry positions (0 .. ``m`` - 1) of its run of boundaries."""

    __slots__ = ("_repeated", "counts", "data_rows", "depths", "end", "kinds", "loose", "m", "mode",
                 "rows", "scalars", "start")  # fmt: skip

    def __init__(
        self,
        kinds: list[Any],
        start: int,
        end: int,
        rows: list[tuple[int, int, str, int, int]],
        counts: tuple[int, ...],
        mode: int,
        scalars: tuple[int, ...] = (),
        loose: tuple[int, ...] = (),
    ) -> None:
        self.kinds = kinds  # the boundary objects, in order
        self._repeated = kinds  # kinds repeated, for comparing many steps at once
        self.m = len(kinds)
        self.start, self.end = start, end  # the entries that open and close the step
        self.rows = rows  # (seq, parent, name, entering entry, leaving entry), by seq
        self.counts = counts  # entries whose (samples, tokens) go to the step
        self.mode = mode
        # User scalars recorded inside the step, and after it (``record()`` after the
        # optimizer step: they belong to no step)
        self.scalars, self.loose = scalars, loose
        depth: dict[int, int] = {}
        for seq, parent, *_ in rows:
            depth[seq] = depth.get(parent, -1) + 1 if parent >= 0 else 0
        self.depths = [depth[r[0]] for r in rows]
        # Top-level "data" phases: the step's data-loading wait (efficiency.py).
        self.data_rows = [i for i, r in enumerate(rows) if r[1] < 0 and r[2] == "data"]

    def match(self, kinds: list[Any], stacks: list[Any], i: int, stack: list[Any]) -> int:
        """How many whole steps of this shape the log holds from entry ``i`` (0 if none):
        ``kinds`` and ``stacks`` are the log entries' kinds and thread stacks."""
        m = self.m
        k = (len(kinds) - i) // m
        if not k or kinds[i : i + m] != self.kinds:
            return 0
        if len(self._repeated) < k * m:
            self._repeated = self.kinds * k
        rep = self._repeated
        if kinds[i : i + k * m] != rep[: k * m]:
            ok, bad = 1, k  # the longest run of whole steps, by bisection (C compares)
            while bad - ok > 1:
                mid = (ok + bad) // 2
                if kinds[i : i + mid * m] == rep[: mid * m]:
                    ok = mid
                else:
                    bad = mid
            k = ok
        run = stacks[i : i + k * m]
        if run.count(stack) != len(run):  # (PhaseStack compares by identity)
            k = next(j for j, s in enumerate(run) if s is not stack) // m
        return k


class StepBlock:
    """``k`` consecutive steps of one :class:`Template`, indices ``first`` .. ``first+k-1``.

    Columns (lists, one item per step): ``starts``/``ends`` (host ns), ``seconds`` (host
    step seconds), ``samples``/``tokens`` (None where unknown), ``phase_seconds`` (per
    template row); computed off the recorder's lock by :meth:`columns`.
    """

    __slots__ = ("_data", "_entries", "_times", "efficiency_of", "ends", "first", "flops",
                 "flops_source", "k", "phase_seconds", "samples", "scalars", "seconds", "starts",
                 "template", "tokens")  # fmt: skip

    def __init__(self, template: Template, entries: list[tuple[Any, ...]], first: int) -> None:
        self.template = template
        self._entries = entries  # the k * m log entries
        self.first = first
        self.k = len(entries) // template.m
        self.flops: float | None = None  # set by the efficiency tracker
        self.flops_source = ""
        # (block, i) -> StepEfficiency of step i, when the worker has a tracker
        self.efficiency_of: Callable[[StepBlock, int], Any] | None = None
        self._data: list[float] | None = None

    def columns(self) -> None:
        """Derive the columns (from the log entries, or from :meth:`from_raw`'s)."""
        if self._entries:
            self.take_raw()
        tpl, m = self.template, self.template.m
        times = self._times
        starts = self.starts = times[tpl.start :: m]
        ends = self.ends = times[tpl.end :: m]
        # The recorder's own arithmetic, so each figure is the one the replay would give.
        self.seconds = [(b - a) / 1e9 if b > a else 0.0 for a, b in zip(starts, ends, strict=True)]
        self.phase_seconds = [
            [
                (b - a) / 1e9 if b > a else 0.0
                for a, b in zip(times[i0::m], times[i1::m], strict=True)
            ]
            for _, _, _, i0, i1 in tpl.rows
        ]

    def take_raw(self) -> tuple[list[int], list[int | None], list[int | None], Any]:
        """What the columns derive from, in plain lists (the log entries are let go):
        every entry's time, each step's samples and tokens and its scalars (or None)."""
        tpl, m = self.template, self.template.m
        self._times = list(map(_TIME, self._entries))
        self.samples, self.tokens = self._counts()
        # Each step's scalars, resolved as the worker resolves a replayed step's.
        self.scalars: list[list[tuple[str, float]]] | None = None
        if tpl.scalars:
            per_step: list[list[tuple[str, float]]] = [[] for _ in range(self.k)]
            for p in tpl.scalars:
                for out, entry in zip(per_step, self._entries[p::m], strict=True):
                    out.extend(
                        (n, v) for n, raw in entry[3] if (v := scalar_value(raw)) is not None
                    )
            self.scalars = per_step
        self._entries = []
        return self._times, self.samples, self.tokens, self.scalars

    @classmethod
    def from_raw(
        cls,
        template: Template,
        first: int,
        times: list[int],
        samples: list[int | None],
        tokens: list[int | None],
        scalars: list[list[tuple[str, float]]] | None,
    ) -> StepBlock:
        """A block rebuilt from :meth:`take_raw`'s lists (in the sidecar's process)."""
        block = cls(template, [], first)
        block.k = len(times) // template.m
        block._times, block.samples, block.tokens, block.scalars = times, samples, tokens, scalars
        return block

    def _counts(self) -> tuple[list[int | None], list[int | None]]:
        tpl, m = self.template, self.template.m
        if not tpl.counts:
            none: list[int | None] = [None] * self.k
            return none, list(none)
        c = tpl.counts[0]
        samples = list(map(_SAMPLES, self._entries[c::m]))
        tokens = list(map(_TOKENS, self._entries[c::m]))
        for c in tpl.counts[1:]:  # several fetches per step (gradient accumulation)
            more = self._entries[c::m]
            samples = [_add(a, e[3]) for a, e in zip(samples, more, strict=True)]
            tokens = [_add(a, e[4]) for a, e in zip(tokens, more, strict=True)]
        return samples, tokens

    def data_seconds(self) -> list[float]:
        """Each step's time in top-level ``data`` phases, summed as the replay's step is."""
        if self._data is not None:
            return self._data
        rows = self.template.data_rows
        if not rows:
            out = [0.0] * self.k
        else:
            cols = [self.phase_seconds[i] for i in rows]
            out = [0.0 + v for v in cols[0]]
            for col in cols[1:]:
                out = [a + v for a, v in zip(out, col, strict=True)]
        self._data = out
        return out

    def step(self, i: int) -> ResolvedStep:
        """Step ``first + i`` as the replay would have resolved it."""
        tpl, m = self.template, self.template.m
        rs = ResolvedStep(self.first + i, self.starts[i], self.ends[i])
        rs.samples, rs.tokens = self.samples[i], self.tokens[i]
        times = self._times
        base = i * m
        rs.rows = [
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
        if self.efficiency_of is not None:
            rs.efficiency = self.efficiency_of(self, i)
        return rs

    def steps(self) -> list[ResolvedStep]:
        return [self.step(i) for i in range(self.k)]


def _add(total: int | None, more: int | None) -> int | None:
    """The recorder's count arithmetic: None until a count arrives."""
    return total if more is None else (total or 0) + more
