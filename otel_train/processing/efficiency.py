"""Efficiency figures from resolved steps: achieved FLOP/s, MFU, data stall share, goodput.

Runs on the worker thread, once per resolved step, under the aggregator's lock.

- FLOPs per step come from ``flops_per_step`` (given), ``flops="estimate"``
  (6 x trainable parameters x tokens, the decoder-only transformer rule, stated as an
  estimate), or a count (:mod:`.flops`) per batch size (samples, tokens). A step whose
  size has not been counted yet is scaled from the nearest counted size and
  labelled ``scaled``; when it differs from that size by more than 10% the tracker
  arms the probe to count it on a later step (at most ``MAX_COUNTED_SIZES`` sizes
  and ``flops.MAX_COUNTED_STEPS`` counted steps per run, then scaling only).
- Achieved FLOP/s = FLOPs / step seconds (device time when CUDA events measured it,
  host time otherwise); MFU = achieved / the device's dense peak for the dtype the
  matmuls ran in (:mod:`.peaks`). The counted step itself gets no rate (it is slow).
- Data stall share = time in top-level ``data`` phases / host step time.
- Goodput = training time (step time minus data waits) / wall time from the first
  step (or region) to the last; the rest is split into data, evaluation,
  checkpoint (regions marked with ``otel_train.region()`` or by the trainer adapters)
  and other (everything outside steps and regions).

Exported: achieved FLOP/s and MFU over the window, the wall time's split as the
``run.time`` counters, and whether a model ran under torch.compile (``torch.compiled``).
Data stall and goodput are on step spans, the console and the run summary, and in PromQL
from ``run.time`` (``contract.DERIVED``): no gauge of their own.
"""

from __future__ import annotations

import collections
import logging
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import contract as c
from ..recording.flop_counts import CountResult, FlopKey, parameter_count
from ..recording.regions import RegionLog
from ..settings import Settings
from .aggregate import MetricsAggregator
from .blocks import EfficiencyColumns, StepBlock
from .goodput import Goodput
from .peaks import Peak, lookup_peak

if TYPE_CHECKING:
    import torch

    from .flops import FlopProbe

# The sidecar runs these figures too, on what the training process sends (its probe's
# counts, the model's facts): what needs torch (the probe, the models, the device) is
# imported where the training process uses it, and the sidecar never imports torch.

_log = logging.getLogger("otel_train")
MAX_COUNTED_SIZES = 8
RECOUNT_CHANGE = 0.1  # a size within 10% (tokens, else samples) of a counted one is scaled
MAX_RECOUNT_REQUESTS = 2  # times a new size arms the probe before it is only scaled
# A new size is counted only while counted steps took at most this share of the step
# time seen so far (the first count always runs): a short run is not made of counts.
COUNT_BUDGET = 0.05
COST_BASELINE_STEPS = 5  # steps after the count whose median is the counted step's baseline


def _cuda_in_use() -> bool:
    import torch

    return torch.cuda.is_available() and bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def _cuda_index(model: torch.nn.Module) -> int | None:
    """The CUDA device of the model's first parameter (None: not on CUDA)."""
    p = next(iter(model.parameters()), None)
    return p.device.index if p is not None and p.device.type == "cuda" else None


def _optimized_type() -> Any:
    """torch.compile's module wrapper type, if Dynamo was imported (importing it costs
    ~1 s: a process that never compiled has no compiled module)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", ()) if eval_frame is not None else ()


def _dynamo_graphs() -> int:
    """Graphs Dynamo compiled in this process so far (0 when it was never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return 0
    try:
        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return 0


class ModelFacts(NamedTuple):
    """What the figures need of the training process's models and device (the sidecar
    gets them with its deliveries: :meth:`EfficiencyTracker.take_facts`)."""

    parameters: int  # trainable
    dtype: str  # the parameters' dtype label ("" when unsure)
    device: str | None  # the CUDA device's name when CUDA is in use
    compiled: bool = False  # a model ran under torch.compile


class EfficiencyTracker:
    def __init__(
        self,
        settings: Settings,
        recorder: Any,
        regions: RegionLog,
        window: int,
        probe: Any = None,
    ) -> None:
        """``probe``: what counts FLOPs (default: a FlopProbe on ``recorder`` when the
        settings count); the sidecar passes its stand-in for the training process's."""
        self._given = settings.flops_per_step
        self._estimate = settings.flops == "estimate" and self._given is None
        self._peak_tflops = settings.peak_tflops
        self._peak_dtype = settings.peak_dtype
        self._regions = regions
        self.models: list[Any] = []
        self._params: int | None = None
        self.probe: FlopProbe | None = None
        if settings.flops == "count" and self._given is None:
            if probe is not None:
                self.probe = probe
            else:
                from .flops import FlopProbe

                self.probe = FlopProbe(recorder, settings.flops_count_step, skip=self._compiled)
                recorder.flop_probe = self.probe
        # The model facts known in another process (the sidecar's; until the first
        # delivery's, a plain (parameters, dtype label, device name) tuple).
        self.model_facts: ModelFacts | tuple[int, str, str | None] | None = None
        self._recorder = recorder
        self._graphs_at_start = _dynamo_graphs()
        self._counted: dict[FlopKey, float] = {}
        self.count_results: list[CountResult] = []  # one per batch size, for the summary
        self.not_counted = ""  # why no step was counted, when the probe said (the summary)
        self._counted_steps: set[int] = set()
        self._requests: dict[FlopKey, int] = {}
        self.count_seconds = 0.0  # every counted step's wall time, recounts included
        self.counted_total = 0  # counted steps
        self.scaled_steps = 0  # steps whose FLOPs were scaled from a counted size
        self._cost_pending: CountResult | None = None
        self._after_count: list[float] = []
        self.count_cost: float | None = None
        self.count_typical: float | None = None  # the median step the cost is taken against
        self.peak: Peak | None = None
        self._peak_known = False
        self.peak_dtype_seen = ""  # the dtype the peak was looked up for ("": unknown)
        self.device_seen = ""  # the device name the peak was looked up for
        self._dtype = ""
        self._win: collections.deque[tuple[float, float]] = collections.deque(maxlen=window)
        self._sums = [0.0, 0.0]  # flops with a rate, their seconds, over the window
        self._mfu_attrs: tuple[tuple[str, str], ...] = ()  # (dtype, the peak's) once known
        self.goodput = Goodput()
        self._exported: dict[str, float] = {}  # run-time counters as last exported
        self.flops_total = 0.0
        self.flop_seconds_total = 0.0
        self.data_total = 0.0
        self.step_total = 0.0
        self.failed = False  # set by disable(): the figures stop, in tables and summary

    def disable(self) -> None:
        """After an error computing the figures: none are shown or exported again."""
        self.failed = True

    def take_facts(self, facts: ModelFacts) -> None:
        """(The sidecar.) The training process's model facts: the parameter count and
        whether a model ran compiled are read from them from now on."""
        self.model_facts = ModelFacts(*facts)
        self._params = None

    def note_model(self, target: Any) -> None:
        """Remember a model instrument() saw (the 6 x parameters x tokens estimate needs it)."""
        import torch

        model = target if isinstance(target, torch.nn.Module) else getattr(target, "model", None)
        if isinstance(model, torch.nn.Module) and all(m is not model for m in self.models):
            self.models.append(model)
            self._params = None
            bind = getattr(self._recorder, "bind_device", None)
            if bind is not None:
                bind(_cuda_index(model))

    def facts(self) -> ModelFacts:
        """What the figures need of the models and device."""
        name = None
        if _cuda_in_use():
            try:
                name = _device_name()
            except Exception:
                name = None
        return ModelFacts(parameter_count(self.models), self._model_dtype(), name, self._compiled())

    def runs_compiled(self) -> bool:
        """Whether a model ran under torch.compile (the run facts and the TORCH_COMPILED
        gauge say so): in the sidecar, as the training process's facts last said."""
        facts = self.model_facts
        if facts is not None:
            return isinstance(facts, ModelFacts) and facts.compiled
        return self._compiled()

    def _compiled(self) -> bool:
        """Whether a model runs under torch.compile: counting would recompile it under the
        counter's dispatch mode (and Dynamo warns about the counter's global hooks)."""
        if getattr(self._recorder, "compiled_seen", False):
            return True  # compiled after instrument(): the torch-loop adapter saw it
        optimized = _optimized_type()
        if any(
            isinstance(m, optimized) or getattr(m, "_compiled_call_impl", None) is not None
            for m in self.models
        ):
            return True
        # torch.compile(model) after instrument() may leave no mark on the model (its hooks
        # can run outside the compiled frame): any graph Dynamo compiled since this session
        # began counts, since compiled kernels are invisible to the counter's dispatch mode.
        return _dynamo_graphs() > self._graphs_at_start

    # -- per step ----------------------------------------------------------------------

    def observe(self, block: StepBlock) -> None:
        """Each of a block's steps: its FLOPs, the achieved rate's share of it, the
        windowed sums and the run totals; the per-step figures go on the block
        (``block.efficiency``, read by the console and by traced steps)."""
        probe = self.probe
        if probe is not None and probe.results:
            self._take_counts()
        flops, source, counted = self._flops_column(block)
        host, best, data = block.seconds, block.rate_seconds(), block.data_seconds()
        rated = [
            f is not None and not n and s > 0 for f, n, s in zip(flops, counted, best, strict=True)
        ]
        rate_flops = [f if ok else 0.0 for f, ok in zip(flops, rated, strict=True)]
        rate_seconds = [s if ok else 0.0 for s, ok in zip(best, rated, strict=True)]
        if any(rated):
            if self._cost_pending is not None:
                self._measure_cost([h for h, ok in zip(host, rated, strict=True) if ok])
            if not self._peak_known:
                self._peak_for()
        # Windowed gauges: sums over the last ``window`` steps of (FLOPs with a rate, their
        # seconds).
        win = self._win
        win.extend(zip(rate_flops, rate_seconds, strict=True))
        self._sums = [sum(col) for col in zip(*win, strict=True)] or [0.0] * 2
        # Run totals and goodput.
        self.flops_total = sum(rate_flops, self.flops_total)
        self.flop_seconds_total = sum(rate_seconds, self.flop_seconds_total)
        self.step_total = sum(host, self.step_total)
        self.data_total = sum(data, self.data_total)
        self.goodput.add_steps(block.starts, block.ends, host, data)
        peak = self.peak.flops_per_s if self.peak is not None else None
        block.efficiency = EfficiencyColumns(flops, source, counted, rate_flops, rate_seconds, peak)

    def _flops_column(self, block: StepBlock) -> tuple[list[Any], list[str], list[bool]]:
        """Each step's FLOPs, how they were found, and whether it was the counted step."""
        k = block.k
        if self._given is not None:
            return [self._given] * k, ["given"] * k, [False] * k
        # FLOPs follow the size computed on: the padded tokens where an adapter counted them.
        padded, tokens = block.padded, block.tokens
        if padded != tokens:
            tokens = [t if p is None else p for p, t in zip(padded, tokens, strict=True)]
        if self._estimate:
            flops = [self._estimated(t) for t in tokens]
            return flops, ["estimate" if f is not None else "" for f in flops], [False] * k
        if self.probe is None:
            return [None] * k, [""] * k, [False] * k
        samples, first = block.samples, block.first
        if samples.count(samples[0]) == k and tokens.count(tokens[0]) == k:
            # One batch size (the usual block): one lookup, the counted step by index.
            value, source, _ = self._flops_of(samples[0], tokens[0], first)
            if source == "scaled":
                self.scaled_steps += k
            done = self._counted_steps
            if (samples[0], tokens[0]) in self._counted and any(
                first <= i < first + k for i in done
            ):
                counted = [i in done for i in range(first, first + k)]
            else:
                counted = [False] * k
            return [value] * k, [source] * k, counted
        counts = enumerate(zip(samples, tokens, strict=True), first)
        out = [self._flops_of(s, t, i) for i, (s, t) in counts]
        sources = [o[1] for o in out]
        self.scaled_steps += sources.count("scaled")
        return [o[0] for o in out], sources, [o[2] for o in out]

    def _measure_cost(self, seconds: list[float]) -> None:
        """The counted step's cost over the median of the next few rated steps (for the
        run summary)."""
        pending, after = self._cost_pending, self._after_count
        for s in seconds:
            if pending is None:
                return
            after.append(s)
            typical = sorted(after)[len(after) // 2]
            self.count_typical = typical
            self.count_cost = max(0.0, pending.seconds - typical)
            if len(after) >= COST_BASELINE_STEPS:
                pending = self._cost_pending = None

    def note_stall(self, t0: int, t1: int) -> None:
        """A stall the hang watch saw end (hangs.py): goodput's "hang" (any thread)."""
        self._regions.done.append(("hang", t0, t1))

    def drain_regions(self, agg: MetricsAggregator) -> None:
        done = self._regions.done
        if not done:
            return
        while done:
            kind, t0, t1 = done.popleft()
            self.goodput.add_region(kind, t0, t1)
        self.publish_goodput(agg)

    def publish_goodput(self, agg: MetricsAggregator | None) -> None:
        """Export the wall time's split (goodput.py), the windowed gauges and the compile
        state (once per batch of steps: gauges are read at collection time)."""
        if agg is None:
            return
        self._publish_window(agg)
        agg.set(c.TORCH_COMPILED.name, (), 1.0 if self.runs_compiled() else 0.0)
        if self.goodput.first is None:
            return
        exported = self._exported
        for k, v in self.goodput.totals().items():
            if v <= 0 and k not in exported:
                continue  # a category's series starts with its first second (docs/scale.md)
            # Counters stay monotonic when a late region moves time between categories.
            exported[k] = max(exported.get(k, 0.0), v)
            agg.set(c.RUN_TIME.name, ((c.A_CATEGORY, k),), exported[k])

    def _publish_window(self, agg: MetricsAggregator) -> None:
        sums = self._sums
        if sums[1] > 0:
            achieved = sums[0] / sums[1]
            agg.set(c.THROUGHPUT_FLOPS.name, (), achieved)
            if self.peak is not None:
                agg.set(c.MFU.name, self._mfu_attrs, achieved / self.peak.flops_per_s)

    def goodput_shares(self) -> tuple[float, dict[str, float]] | None:
        """The wall time and each category's share of it (they sum to 1)."""
        wall = self.goodput.wall()
        if wall <= 0:
            return None
        return wall, {k: v / wall for k, v in self.goodput.totals().items()}

    # -- FLOPs -------------------------------------------------------------------------

    def _take_counts(self) -> None:
        probe = self.probe
        if probe is None:
            return
        while probe.results:
            r = probe.results.popleft()
            if r.not_counted:
                self.not_counted = r.not_counted  # (for the summary)
                continue
            key = r.key
            self.count_seconds += r.seconds
            self.counted_total += 1
            self._counted_steps.add(r.index)
            if len(self._counted_steps) > 64:
                self._counted_steps.remove(min(self._counted_steps))
            if key in self._counted:
                continue  # a recount that met an already-counted size
            self._counted[key] = float(r.flops)
            self.count_results.append(r)
            if r.dtype and not self._dtype:
                self._dtype = r.dtype
            if not self.count_results[:-1]:
                self._cost_pending = r  # the first count's cost is the one reported

    def _flops_of(
        self, samples: int | None, tokens: int | None, index: int
    ) -> tuple[float | None, str, bool]:
        """FLOPs of a step of ``samples`` and ``tokens`` (padded: the size computed on)."""
        if self._given is not None:
            return self._given, "given", False
        if self._estimate:
            flops = self._estimated(tokens)
            return (flops, "estimate", False) if flops is not None else (None, "", False)
        probe = self.probe
        if probe is None:
            return None, "", False
        key = (samples, tokens)
        counted = self._counted.get(key)
        if counted is not None:  # (0: the counter saw none of the step's compute: unknown)
            was_counted = index in self._counted_steps  # (the slow step, whatever it found)
            return (counted, "counted", was_counted) if counted else (None, "", was_counted)
        flops, source, change = self._scaled(key)
        requests = self._requests.get(key, 0)
        if (
            self._counted
            and change > RECOUNT_CHANGE
            and requests < MAX_RECOUNT_REQUESTS
            and not probe.armed
            and not probe.failed
            and len(self._counted) < MAX_COUNTED_SIZES
            and self.count_seconds <= COUNT_BUDGET * self.step_total
        ):
            self._requests[key] = requests + 1
            probe.arm(0)  # count this new size on the next step that begins
        return flops, source, False

    def _estimated(self, tokens: int | None) -> float | None:
        """6 x trainable parameters x tokens (decoder-only transformers), None if unknown."""
        if tokens is None:
            return None
        if self._params is None:
            facts = self.model_facts
            self._params = facts[0] if facts is not None else parameter_count(self.models)
        return 6.0 * self._params * tokens if self._params else None

    def _scaled(self, key: FlopKey) -> tuple[float | None, str, float]:
        """FLOPs of an uncounted size, linear in tokens (else samples) from the nearest
        counted one, and the relative change from it (inf when nothing compares)."""
        samples, tokens = key
        for pos, value in ((1, tokens), (0, samples)):
            if not value:
                continue
            best = None
            for k, f in self._counted.items():
                known = k[pos]
                if known and f and (best is None or abs(known - value) < abs(best[0] - value)):
                    best = (known, f)
            if best is not None:
                return best[1] * value / best[0], "scaled", abs(value - best[0]) / best[0]
        return None, "", float("inf")

    def _peak_for(self) -> Peak | None:
        self._peak_known = True
        dtype = self._peak_dtype
        if dtype == "auto":
            dtype = self._dtype or self._model_dtype()
        self.peak_dtype_seen = dtype
        name = None
        if self.model_facts is not None:
            name = self.model_facts[2] if self._peak_tflops is None else None
        elif self._peak_tflops is None and _cuda_in_use():
            try:
                name = _device_name()
            except Exception:
                name = None
        self.device_seen = name or ""  # (the summary names a MIG slice)
        self.peak = lookup_peak(name, dtype, self._peak_tflops)
        if self.peak is not None:  # (a peak_tflops given with the precision unknown: no dtype)
            self._mfu_attrs = ((c.A_DTYPE, dtype),) if dtype else ()
        elif name:
            _log.info("otel-train: no peak FLOP/s known for %r (%s); set peak_tflops", name, dtype)
        return self.peak

    def _model_dtype(self) -> str:
        """The precision the matmuls run in when nothing counted them (precision.py):
        autocast's as an adapter saw it, else the parameters'; "" when unsure."""
        if self.model_facts is not None:
            return self.model_facts[1]
        import torch

        from ..recording.precision import model_label  # (models of this process: torch is in use)

        rec = self._recorder
        hint = getattr(rec, "precision_hint", None)
        if hint is None and getattr(rec, "compiled_seen", False):
            # A forward traced by torch.compile runs no hook that could read autocast.
            params = [p for m in self.models for p in m.parameters() if p.is_floating_point()]
            if params and params[0].dtype == torch.float32:
                return ""
        return model_label(self.models, hint, cpu=not _cuda_in_use())
