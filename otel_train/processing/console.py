"""Console tables: the per-window phase table and the run summary.

Every ``console_every`` steps::

    otel-train  steps 100-199  step 2.10 ms (max 3.52 ms)  15,238 samples/s
    phase            time/step   % step   peak alloc   % device
    data               0.21 ms     9.9%            -          -
    forward            0.62 ms    29.5%      1.2 GiB       1.5%

At shutdown, the run summary: total wall clock, cumulative time per phase with its
share of the wall clock, and the peak memory of each phase with its share of the
device.

Rollouts the steps consumed (``otel_train.consumed(token)``, recording/tokens.py) are
rows of their own, named after the phase and the generator's role (``rollout
[generator]``): their host seconds and peak memory measured in the generator, per step
of this table, and their share of that process's device.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

from ..recording.collectives import label
from ..recording.layouts import M_ALLOCATED
from .blocks import StepBlock

MAX_ROWS = 256  # distinct phase rows kept; further names share "_other"


def fmt_seconds(s: float) -> str:
    if s >= 100:
        return f"{s:,.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if b < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return "-"  # pragma: no cover


class _PhaseTotals:
    __slots__ = ("count", "depth", "peak", "remote", "seconds", "total")

    def __init__(self, depth: int, remote: bool = False) -> None:
        self.seconds = 0.0
        self.count = 0
        self.peak: int | None = None
        self.depth = depth
        self.remote = remote  # another process's phase, from consumed tokens
        self.total: int | None = None  # that process's device memory (remote rows)


class ConsoleReporter:
    def __init__(
        self,
        every: int,
        stream: str,
        efficiency: Any = None,
        label: str = "",
        record_dir: str | None = None,
        verdict_limits: Any = None,
    ) -> None:
        """``efficiency``: the efficiency.EfficiencyTracker whose figures the tables and
        the summary show, when there is one; ``label``: what names this process in each
        table and summary (``rank 3`` when several ranks print); ``record_dir``: the run
        record's directory, named at the end of the summary."""
        self.every = every
        self.record_dir = record_dir
        self.verdict_limits = verdict_limits  # settings.verdicts.VerdictSettings, or none
        self._head = f"otel-train [{label}]" if label else "otel-train"
        self._stream_name = stream
        # Where the text goes instead of the stream when set: the sidecar's hands it to
        # the training process, which writes it to its own sys.stderr/sys.stdout object.
        self.sink: Callable[[str], None] | None = None
        self.device_total: int | None = None
        self.drops: dict[str, int] = {}  # what was dropped, by reason (the worker's, at its end)
        # The adapters' lines for the summary (recording/notes.py), as last delivered
        self.notes: Callable[[], tuple[str, ...]] = tuple
        # (depth, phase) -> totals; the window folds into the run table when it resets.
        self._window: dict[tuple[int, str], _PhaseTotals] = {}
        self._run: dict[tuple[int, str], _PhaseTotals] = {}
        self._win_steps = 0
        self._win_first = -1
        self._win_seconds = 0.0
        self._win_max = 0.0
        self._win_samples = 0
        self._win_tokens = 0
        self.run_steps = 0
        self.run_step_seconds = 0.0
        self.first_start: int | None = None
        self.last_end: int | None = None
        self.run_samples = 0
        self.run_tokens = 0
        self.run_wait = 0.0  # seconds the steps waited in collectives (collectives.py)
        self.last_scalars: dict[str, float] = {}
        self.efficiency = efficiency
        self._win_flops = 0.0
        self._win_flop_seconds = 0.0
        self._win_data = 0.0

    @property
    def stream(self) -> TextIO | None:
        if self._stream_name == "off":
            return None
        return sys.stdout if self._stream_name == "stdout" else sys.stderr

    def add(self, block: StepBlock) -> None:
        """Add a block of steps, printing a table each ``every`` steps."""
        if self._stream_name == "off":
            return  # no tables and no summary: nothing reads the totals
        i, n = 0, block.k
        while i < n:
            take = n - i if not self.every else max(1, min(n - i, self.every - self._win_steps))
            self._add_window(block, i, i + take)
            i += take
            if self.every and self._win_steps >= self.every:
                self.print_window()

    def _add_window(self, block: StepBlock, lo: int, hi: int) -> None:
        """Steps ``lo`` .. ``hi - 1`` of a block, all in the current window. Sums run in
        step order from the window's totals, so any batching gives the same floats."""
        if self._win_steps == 0:
            self._win_first = block.first + lo
        if self.first_start is None:
            self.first_start = block.starts[lo]
        self.last_end = block.ends[hi - 1]
        eff = block.efficiency
        if eff is not None:  # efficiency figures are on
            self._win_data = sum(block.data_seconds()[lo:hi], self._win_data)
            self._win_flops = sum(eff.rate_flops[lo:hi], self._win_flops)
            self._win_flop_seconds = sum(eff.rate_seconds[lo:hi], self._win_flop_seconds)
        window, shape, memory = self._window, block.shape, block.memory
        waits = shape.waits
        for r, key in enumerate(zip(shape.depths, shape.names, strict=True)):
            t = window.get(key) or self._new_row(key)
            t.seconds = sum(block.phase_seconds[r][lo:hi], t.seconds)
            if waits.any:  # a phase's own work: less the collectives it waited in
                for w in waits.inside[r]:
                    t.seconds -= sum(block.phase_seconds[w][lo:hi])
            t.count += hi - lo
            if memory is not None:
                peaks = [m[M_ALLOCATED] for m in memory[r][lo:hi] if m is not None]
                if peaks and (t.peak is None or max(peaks) > t.peak):
                    t.peak = max(peaks)
        for x in block.consumed:
            if lo <= x < hi:
                for item in block.step(x).consumed or ():
                    self._add_consumed(item)
        if block.scalars is not None:
            for items in block.scalars[lo:hi]:
                for name, value in items:
                    self.last_scalars[name] = value
        if waits.any:
            self.run_wait = sum(block.wait_seconds()[lo:hi], self.run_wait)
        samples = sum(v for v in block.samples[lo:hi] if v)
        tokens = sum(v for v in block.tokens[lo:hi] if v)
        self._add_totals(block.seconds[lo:hi], samples, tokens)

    def _add_consumed(self, item: Any) -> None:
        """A consumed rollout's figures (tokens.Consumed) into its remote row."""
        key = (0, f"{item.name} [{item.role or 'remote'}]")
        t = self._window.get(key) or self._new_row(key, remote=True)
        t.seconds += item.seconds or 0.0
        t.count += 1
        if item.peak is not None and (t.peak is None or item.peak > t.peak):
            t.peak = item.peak
        if item.device_total:
            t.total = item.device_total

    def _new_row(self, key: tuple[int, str], remote: bool = False) -> _PhaseTotals:
        """The window's row for a (depth, phase) not seen in it yet; past MAX_ROWS rows,
        further names share "_other" (a bounded table)."""
        window = self._window
        if len(window) + len(self._run) >= MAX_ROWS:
            key = (0, "_other")
            t = window.get(key)
            if t is not None:
                return t
        t = window[key] = _PhaseTotals(key[0], remote)
        return t

    def _add_totals(self, seconds: list[float], samples: int, tokens: int) -> None:
        n = len(seconds)
        self._win_steps += n
        self._win_seconds = sum(seconds, self._win_seconds)
        self._win_max = max(self._win_max, *seconds)
        self._win_samples += samples
        self._win_tokens += tokens
        self.run_steps += n
        self.run_step_seconds = sum(seconds, self.run_step_seconds)
        self.run_samples += samples
        self.run_tokens += tokens

    def _pct_device(self, t: _PhaseTotals) -> str:
        total = t.total if t.remote else self.device_total
        if t.peak is None or not total:
            return "-"
        return f"{100.0 * t.peak / total:.1f}%"

    def print_window(self) -> None:
        out = self.stream
        n = self._win_steps
        if out is None or n == 0:
            self._reset_window()
            return
        mean = self._win_seconds / n
        head = (
            f"{self._head}  steps {self._win_first}-{self._win_first + n - 1}  "
            f"step {fmt_seconds(mean)} (max {fmt_seconds(self._win_max)})"
        )
        if self._win_seconds > 0 and self._win_samples:
            head += f"  {self._win_samples / self._win_seconds:,.0f} samples/s"
        if self._win_seconds > 0 and self._win_tokens:
            head += f"  {self._win_tokens / self._win_seconds:,.0f} tokens/s"
        head += self._efficiency_head()
        if self.last_scalars:
            head += "  " + "  ".join(f"{k} {v:.4g}" for k, v in self.last_scalars.items())
        lines = [
            head,
            f"{'phase':<24}{'time/step':>12}{'% step':>9}{'peak alloc':>13}{'% device':>10}",
        ]
        for (depth, name), t in self._window.items():
            name = "  " * depth + label(name)
            per_step = t.seconds / n
            pct = 100.0 * t.seconds / self._win_seconds if self._win_seconds > 0 else 0.0
            lines.append(
                f"{name:<24}{fmt_seconds(per_step):>12}{_pct(pct, t):>9}"
                f"{fmt_bytes(t.peak):>13}{self._pct_device(t):>10}"
            )
        self._write("\n".join(lines), out)
        self._reset_window()

    def _write(self, text: str, out: TextIO) -> None:
        sink = self.sink
        if sink is not None:
            sink(text)
        else:
            print(text, file=out, flush=True)

    def _efficiency_head(self) -> str:
        tracker = self.efficiency
        if tracker is None or tracker.failed:
            return ""
        text = ""
        if self._win_flop_seconds > 0:
            rate = self._win_flops / self._win_flop_seconds
            text += f"  {rate / 1e12:,.3g} TFLOP/s"
            if tracker.peak is not None:
                text += f"  MFU {100.0 * rate / tracker.peak.flops_per_s:.1f}%"
        if self._win_seconds > 0:
            text += f"  data stall {100.0 * self._win_data / self._win_seconds:.1f}%"
        return text

    def _fold_window(self, into: dict[tuple[int, str], _PhaseTotals]) -> None:
        for key, w in self._window.items():
            t = into.get(key)
            if t is None:
                t = into[key] = _PhaseTotals(w.depth, w.remote)
            t.total = w.total or t.total
            t.seconds += w.seconds
            t.count += w.count
            if w.peak is not None and (t.peak is None or w.peak > t.peak):
                t.peak = w.peak

    def _reset_window(self) -> None:
        self._fold_window(self._run)
        self._window = {}
        self._win_steps = 0
        self._win_seconds = 0.0
        self._win_max = 0.0
        self._win_samples = 0
        self._win_tokens = 0
        self._win_flops = self._win_flop_seconds = self._win_data = 0.0

    def summary_text(self) -> str:
        notes = [f"  {line}" for line in self.notes()]
        if self.run_steps == 0 or self.first_start is None or self.last_end is None:
            return "\n".join([f"{self._head} run summary: no training steps recorded", *notes])
        wall = max(1e-12, (self.last_end - self.first_start) / 1e9)
        lines = [
            f"{self._head} run summary: {self.run_steps} steps, wall clock {fmt_seconds(wall)} "
            f"(first step to last), in steps {fmt_seconds(self.run_step_seconds)} "
            f"({100.0 * self.run_step_seconds / wall:.1f}%)",
        ]
        if self.run_samples:
            lines.append(f"  {self.run_samples:,} samples ({self.run_samples / wall:,.1f}/s)")
        if self.run_tokens:
            lines.append(f"  {self.run_tokens:,} tokens ({self.run_tokens / wall:,.1f}/s)")
        lines += notes
        if self.efficiency is not None and not self.efficiency.failed:
            from .efficiency_lines import summary_lines

            lines += summary_lines(self.efficiency, fmt_seconds)
        if self.run_wait > 0 and self.run_step_seconds > 0:
            share = 100.0 * self.run_wait / self.run_step_seconds
            lines.append(f"  waiting in collectives {share:.1f}% of step time "
                         f"({fmt_seconds(self.run_wait)})")  # fmt: skip
        lines.append(
            f"{'phase':<24}{'total':>12}{'% wall':>9}{'calls':>8}{'peak alloc':>13}{'% device':>10}"
        )
        run: dict[tuple[int, str], _PhaseTotals] = {}
        for key, t in self._run.items():
            run[key] = _PhaseTotals(t.depth, t.remote)
            run[key].seconds, run[key].count, run[key].peak = t.seconds, t.count, t.peak
            run[key].total = t.total
        self._fold_window(run)  # steps since the last table
        for (depth, name), t in run.items():
            name = "  " * depth + label(name)
            lines.append(
                f"{name:<24}{fmt_seconds(t.seconds):>12}{_pct(100.0 * t.seconds / wall, t):>9}"
                f"{t.count:>8}{fmt_bytes(t.peak):>13}{self._pct_device(t):>10}"
            )
        return "\n".join(lines + self._dropped() + self._verdicts())

    def _dropped(self) -> list[str]:
        """What the figures above are missing (otel_train.dropped): shutdown() says False."""
        if not self.drops:
            return []
        each = ", ".join(f"{n:,} {reason}" for reason, n in sorted(self.drops.items()))
        return [f"telemetry dropped (not in the figures above): {each} "
                "(reasons: docs/telemetry.md, otel_train.dropped)"]  # fmt: skip

    def _verdicts(self) -> list[str]:
        """The verdicts (verdicts.py) the summary's own figures decide: input-bound and
        collectives; the run record's (otel-train compare, the report) have them all."""
        if self.verdict_limits is None:
            return []
        from .verdicts import Figures, verdicts

        eff, steps = self.efficiency, self.run_step_seconds
        stall = eff.data_total / eff.step_total if eff and eff.step_total > 0 else None
        waits = self.run_wait / steps if self.run_wait > 0 and steps > 0 else None
        found = verdicts(Figures(data_stall=stall, collective_share=waits), self.verdict_limits)
        return [f"verdict: {line}" for line in found]

    def print_summary(self) -> None:
        out = self.stream
        if out is not None:
            text = self.summary_text()
            if self.record_dir is not None:
                text += "\n" + record_line(self.record_dir)
            self._write(text, out)


def record_line(directory: str) -> str:
    """Where the run record is, and the command that makes its report."""
    return f"otel-train: run record in {directory}  (report: otel-train report {directory})"


def _pct(pct: float, t: _PhaseTotals) -> str:
    """A share of this process's time; none for another process's phase (it ran beside
    the steps, not in them)."""
    return "-" if t.remote else f"{pct:.1f}%"
