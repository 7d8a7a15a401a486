"""FLOPs per step: counted once with torch's ``FlopCounterMode``, given, or estimated.

Counting runs one whole step (data, forward, backward, optimizer) under
``torch.utils.flop_counter.FlopCounterMode``, which sees every aten operator the step
dispatches, forward and backward alike, and adds up the matmul, convolution and
attention FLOPs (the convention MFU uses: elementwise work is not counted). That
step is slow, several times its normal duration, because every operator goes
through Python; it is counted once per batch size and its cost is reported in the
run summary. Between counts the recorder holds
``flop_probe = None``, so a step pays one attribute test and nothing else.

A second, tiny dispatch mode runs next to the counter and notes the dtype the
matmuls ran in; after the step, that dtype and PyTorch's precision settings
(recording/precision.py) label the FLOPs, which picks the peak MFU is measured against
("mixed" when no precision holds nine tenths of them: no MFU).

Nothing of the count raises into the user's operators: higher-order operators
(``torch.cond``, eager ``flex_attention``) pass through the dtype mode to the counter,
which counts them; an error in the dtype noting or in one of torch's FLOP formulas is
kept, the formula counts 0, and the step ends the count without a result (logged once,
no more counts). What the operators themselves raise passes through unchanged.

Tensor parallelism: a DTensor operator shows its global shapes, but each rank computes
on its local shards. The dtype mode hands DTensor operators on to DTensor's own dispatch
(``NotImplemented``), which runs them on the local tensors with both modes still active,
so the counter counts the local operators: the FLOPs this rank ran. Operators on tensor
subclasses that dispatch themselves (DTensor, the fake tensors DTensor's sharding
propagation runs on) count 0; what they run on plain tensors is counted.

Usage (what the efficiency tracker and the recorder do)::

    probe = FlopProbe(recorder, first_index=1)
    recorder.flop_probe = probe          # armed: counts the first step with index >= 1
    ...                                  # the recorder calls probe.begin(step) / probe.end(step)
    probe.results                        # deque of CountResult, drained by the worker
"""

from __future__ import annotations

import collections
import logging
import math
import sys
import threading
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..recording.flop_counts import CountResult, FlopKey
from ..recording.precision import dispatches_itself, dtype_label
from ..recording.precision import dominant as dominant_label

_log = logging.getLogger("otel_train")

# Operators whose input dtype tells which tensor-core rate the step ran at.
_MATMUL_NAMES = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
    "_efficient_attention_forward", "_scaled_mm", "_scaled_dot_product_flash_attention_for_cpu",
    "_grouped_mm",
})  # fmt: skip


def _on_subclass(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether an operator call has a self-dispatching tensor among its inputs (one list
    level deep, as operator schemas take them)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            if any(dispatches_itself(x) for x in a):
                return True
        elif dispatches_itself(a):
            return True
    return False


def _dtensor_type() -> Any:
    """DTensor's class when tensor parallelism was imported (else None: none exists)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


COMPILED = (
    "the model runs under torch.compile, which would recompile under the counter; give "
    "flops_per_step= (or flops='estimate') for MFU"
)
MAX_MISSES = 2  # counted steps of an already-counted size before a recount gives up
MAX_COUNTED_STEPS = 32  # slow counted steps per run, whatever the sizes do


class _MatmulDtypes(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's mode base is untyped
    """Notes each matmul-like operator call's input dtype; changes nothing.

    Only dtypes are noted here: what a float32 input means (fp32 or tf32) is read after
    the step (:meth:`dominant`), because PyTorch's precision getters can raise, and an
    error inside ``__torch_dispatch__`` would come out of the user's own operator."""

    # Higher-order operators (torch.cond, eager flex_attention) come here too, and go on
    # to the counter below, which counts them; a mode without this makes them raise.
    supports_higher_order_operators = True

    def __init__(self, formulas: Any = ()) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.formulas = formulas  # the operators the counter has a formula for
        self.uncounted: set[str] = set()  # attention operators that ran with none
        # (operator packet, input dtype or None for fp8 scaled matmuls, is a convolution,
        # runs on the CPU)
        self.calls: collections.Counter[tuple[Any, Any, bool, bool]] = collections.Counter()
        self.error: Exception | None = None  # the count's own first error: no result

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        dtensor = _dtensor_type()
        if dtensor is not None and dtensor in types:
            # DTensor's dispatch runs it on the local shards, through these modes again.
            return NotImplemented
        if self.error is None:
            try:
                self._note(func, args)
            except Exception as err:
                self.error = err
        return func(*args, **(kwargs or {}))

    def _note(self, func: Any, args: tuple[Any, ...]) -> None:
        packet = getattr(func, "overloadpacket", None)  # (None: a higher-order operator)
        name = packet.__name__ if packet is not None else ""
        if "attention" in name and packet not in self.formulas:
            self.uncounted.add(name)  # (its FLOPs are missing from the count)
        if name in _MATMUL_NAMES and not _on_subclass(args, {}):
            for a in args:
                if isinstance(a, torch.Tensor) and a.is_floating_point():
                    dtype = None if name == "_scaled_mm" else a.dtype
                    cpu = a.device.type == "cpu"
                    self.calls[(packet, dtype, name == "convolution", cpu)] += 1
                    break

    def guarded(self, formula: Callable[..., int]) -> Callable[..., int]:
        """``formula`` (one of torch's FLOP formulas, called as the counter calls them)
        counting 0 instead of raising into the operator; its error is kept here."""

        def formula_or_zero(*args: Any, **kwargs: Any) -> int:
            if self.error is None and not _on_subclass(args, kwargs):
                try:
                    return formula(*args, **kwargs)
                except Exception as err:
                    self.error = err
            return 0

        return formula_or_zero

    def dominant(self, flops_by_op: dict[Any, int]) -> str:
        """The precision holding most of the step's counted FLOPs (precision.dominant();
        calls weigh in for operators the counter gave no FLOPs)."""
        calls: dict[Any, collections.Counter[str]] = {}
        for (op, dtype, conv, cpu), n in self.calls.items():
            label = "fp8" if dtype is None else dtype_label(dtype, conv, cpu)
            calls.setdefault(op, collections.Counter())[label] += n
        weights: dict[str, float] = {}
        for op, labels in calls.items():
            total = sum(labels.values())
            weight = flops_by_op.get(op, 0) or total
            for label, n in labels.items():
                weights[label] = weights.get(label, 0.0) + weight * n / total
        return dominant_label(weights)


class _GlobalOnly:
    """Stands in for FlopCounterMode's module tracker: every FLOP goes to "Global".

    The tracker registers global module hooks while counting; with those present, calling
    a torch.compile'd module warns (and the hooks would fire inside the user's model).
    Only the total is needed here.
    """

    parents = ("Global",)

    def __enter__(self) -> _GlobalOnly:
        return self

    def __exit__(self, *args: object) -> None:
        return None


def _counting_modes() -> tuple[Any, _MatmulDtypes]:
    """torch's FLOP counter, without its module hooks and with its formulas guarded, and
    the dtype mode beside it (entered in that order)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter: Any = FlopCounterMode(display=False, custom_mapping=_own_formulas())
    if hasattr(counter, "mod_tracker"):
        counter.mod_tracker = _GlobalOnly()
    registry = getattr(counter, "flop_registry", None)  # (what the counter calls per op)
    dtypes = _MatmulDtypes(frozenset(registry) if isinstance(registry, dict) else ())
    if isinstance(registry, dict):
        counter.flop_registry = {op: dtypes.guarded(f) for op, f in registry.items()}
    return counter, dtypes


def _grouped_mm_flops(
    a: tuple[int, ...], b: tuple[int, ...], *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    """``aten._grouped_mm`` (mixture-of-experts layers), from the shapes: two 2-d operands
    split the contraction into groups (``(m, K) @ (K, n)``, out ``(groups, m, n)``); else
    each output element is one dot product over ``a``'s last dimension."""
    if len(a) == 2 and len(b) == 2:
        return 2 * a[0] * a[1] * b[1]
    return 2 * math.prod(out_shape or ()) * a[-1]


def _own_formulas() -> dict[Any, Callable[..., int]]:
    """FLOP formulas for operators this torch's counter has none for."""
    from torch.utils.flop_counter import flop_registry

    op = getattr(torch.ops.aten, "_grouped_mm", None)
    return {op: _grouped_mm_flops} if op is not None and op not in flop_registry else {}


class FlopProbe:
    """Counts the FLOPs of one step when armed; the recorder calls begin()/end()."""

    def __init__(
        self, recorder: Any, first_index: int, skip: Callable[[], bool] | None = None
    ) -> None:
        self._rec = recorder
        self._skip = skip  # True: do not count (a compiled model); checked when a count begins
        self.target = first_index
        self._counter: Any = None
        self._dtypes: _MatmulDtypes | None = None
        self._step: Any = None
        self._thread = 0
        self.results: collections.deque[CountResult] = collections.deque(maxlen=64)
        self._seen: set[FlopKey] = set()
        self.counted_steps = 0
        self._misses = 0
        self.failed = False
        self._aborted = False
        self._step_error: Exception | None = None  # what the last count's modes kept

    @property
    def armed(self) -> bool:
        return self._rec.flop_probe is self

    def arm(self, at_index: int = 0) -> None:
        """Count the next step whose index is at least ``at_index`` (worker thread)."""
        if not self.failed and not self._aborted and self.counted_steps < MAX_COUNTED_STEPS:
            self.target = at_index
            self._rec.flop_probe = self

    def disarm(self) -> None:
        if self._rec.flop_probe is self:
            self._rec.flop_probe = None

    # -- training thread ---------------------------------------------------------------

    def begin(self, step: Any) -> None:
        if self._aborted:
            self.abort()
            return
        if step.index < self.target:
            return
        try:
            if self._skip is not None and self._skip():
                self.failed = True
                self.disarm()
                _log.info("otel-train: FLOPs not counted: %s", COMPILED)
                # (the summary says so too, wherever it is made: this crosses the pipe)
                self.results.append(CountResult(index=step.index, samples=step.samples,
                                                tokens=step.tokens, padded=step.padded,
                                                flops=0, dtype="", seconds=0.0,
                                                not_counted=COMPILED))  # fmt: skip
                return
            if self._counter is not None:
                self._stop()  # the step being counted was discarded (an exhausted loader)
            counter, dtypes = _counting_modes()
            counter.__enter__()
            try:
                dtypes.__enter__()  # type: ignore[no-untyped-call]
            except BaseException:
                counter.__exit__(None, None, None)
                raise
            self._counter, self._dtypes, self._step = counter, dtypes, step
            self._thread = threading.get_ident()
        except Exception:
            self._fail()

    def end(self, step: Any, t1: int) -> None:
        if step is not self._step:
            return
        try:
            flops, dtype, uncounted = self._stop()
            if self._step_error is not None:
                self._fail(self._step_error)
                return
            self.counted_steps += 1
            seconds = max(0, t1 - step.t0) / 1e9
            result = CountResult(index=step.index, samples=step.samples, tokens=step.tokens,
                                 padded=step.padded, flops=flops, dtype=dtype,
                                 seconds=seconds, uncounted=uncounted)  # fmt: skip
            self.results.append(result)
            # The size is known only once the step has run: when this one was counted
            # already, stay armed for a few more steps to catch the size asked for.
            key = result.key
            if (
                key in self._seen
                and self._misses < MAX_MISSES
                and self.counted_steps < MAX_COUNTED_STEPS
            ):
                self._misses += 1
                self.target = step.index + 1
            else:
                self._seen.add(key)
                self._misses = 0
                self.disarm()
        except Exception:
            self._fail()

    def abort(self) -> None:
        """Stop counting now, without a result (recording switched off, or shutdown).

        Dispatch modes belong to the thread that entered them: from another thread this
        stays armed (so the recorder keeps it), and the training thread's next call into
        the recorder ends them.
        """
        self._aborted = True  # no count starts after this
        if self._counter is not None and threading.get_ident() != self._thread:
            return
        self.disarm()
        if self._counter is not None:
            try:
                self._stop()
            except Exception:
                self._fail()

    def _stop(self) -> tuple[int, str, tuple[str, ...]]:
        """The count's FLOPs, dominant precision and the attention operators it missed."""
        counter, dtypes = self._counter, self._dtypes
        self._counter = self._dtypes = self._step = None
        self._step_error = None
        if counter is None or dtypes is None:
            return 0, "", ()
        self._step_error = dtypes.error
        if threading.get_ident() != self._thread:
            # Dispatch modes are per thread: this one cannot be popped from here.
            raise RuntimeError("a counted step ended on another thread than it began")
        dtypes.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        counter.__exit__(None, None, None)
        flops = int(counter.get_total_flops())
        return flops, dtypes.dominant(_global_counts(counter)), tuple(sorted(dtypes.uncounted))

    def _fail(self, error: BaseException | None = None) -> None:
        """No count from now on; logged with ``error``, else the exception being handled."""
        self.failed = True
        self.disarm()
        self._counter = self._dtypes = self._step = None
        _log.error("otel-train: counting FLOPs failed; FLOP counting disabled",
                   exc_info=error or True)  # fmt: skip


def count_flops(fn: Any, *args: Any, **kwargs: Any) -> tuple[int, str, float]:
    """FLOPs, matmul dtype and wall seconds of one call of ``fn`` (a helper for tests and
    benchmarks; training steps are counted by :class:`FlopProbe`)."""
    counter, dtypes = _counting_modes()
    t0 = perf_counter_ns()
    with counter, dtypes:
        fn(*args, **kwargs)
    seconds = (perf_counter_ns() - t0) / 1e9
    if dtypes.error is not None:
        raise dtypes.error
    return int(counter.get_total_flops()), dtypes.dominant(_global_counts(counter)), seconds


def _global_counts(counter: Any) -> dict[Any, int]:
    """FLOPs per operator packet (every FLOP goes to "Global": see _GlobalOnly)."""
    try:
        return dict(counter.get_flop_counts().get("Global", {}))
    except Exception:
        return {}
