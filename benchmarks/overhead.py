"""What otel-train costs a training loop, measured side by side in one run.

Prints two tables:

1. Per phase, on the training thread: a bare ``perf_counter_ns()`` pair (the floor),
   otel-train's ``with phase(...)`` and a hand-written OTel SDK span per phase
   (``start_as_current_span`` through a BatchSpanProcessor with a dropping exporter).
2. Whole training steps of a small MLP (DataLoader, forward, backward, SGD): plain,
   instrumented by otel-train at default settings (sampled traces, bridged histograms,
   console off), the same found by the zero-code path's process-wide hooks
   (``opentelemetry-instrument``; with the ``auto`` extra installed), and instrumented
   with one SDK span per phase plus one per step. The
   timed region ends after otel-train's worker has processed every step, so its
   background CPU work is counted. Variants run interleaved in rounds; figures are
   medians over rounds, and deltas are medians of per-round differences.

Usage: python benchmarks/overhead.py [--steps 50] [--rounds 40] [--hidden 448] [--threads N]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import otel_train
from otel_train import session
from otel_train.export.setup import in_memory_meter_provider


class DroppingExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def sdk_tracer_provider() -> TracerProvider:
    tp = TracerProvider(shutdown_on_exit=False)
    # A queue that never fills: under callgrind (instructions.py) the export thread runs
    # far less often than natively, and a full queue would log every dropped span.
    tp.add_span_processor(BatchSpanProcessor(DroppingExporter(), max_queue_size=1 << 16))
    return tp


# -- 1. per-phase micro benchmark ---------------------------------------------------------


def micro(n: int, repeats: int) -> dict[str, float]:
    pc = time.perf_counter_ns
    tp = sdk_tracer_provider()
    tracer = tp.get_tracer("bench")
    mp, _reader = in_memory_meter_provider()
    otel_train.configure(tracer_provider=tp, meter_provider=mp, console="off")
    rec = session.current().recorder  # type: ignore[union-attr]

    def floor() -> int:
        t = pc()
        for _ in range(n):
            a = pc()
            b = pc()
        return pc() - t - 0 * (b - a)

    replay_ns = [0]

    def ours() -> int:
        # Chunks short enough that the log never overflows: the training thread only logs
        # (as in a run, where the worker settles the log every 50 ms); the replay of each
        # chunk is timed apart and reported as the worker's share.
        scope = rec.phase("forward")
        spent = 0
        with rec.step():
            for _ in range(n // 1000):
                t = pc()
                for _ in range(1000):
                    with scope:
                        pass
                spent += pc() - t
                t = pc()
                rec.settle()
                replay_ns[0] += pc() - t
        return spent * n // (n // 1000 * 1000)

    def span() -> int:
        t = pc()
        for _ in range(n):
            with tracer.start_as_current_span("forward"):
                pass
        return pc() - t

    def empty() -> int:
        t = pc()
        for _ in range(n):
            pass
        return pc() - t

    variants: dict[str, Callable[[], int]] = {
        "empty loop": empty,
        "perf_counter_ns pair (floor)": floor,
        "otel-train phase(), train thread": ours,
        "OTel SDK span": span,
    }
    results: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(repeats):
        names = list(variants)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            gc.collect()
            results[name].append(variants[name]() / n)
        session.current().worker.process()  # type: ignore[union-attr]
    otel_train.shutdown()
    tp.shutdown()
    out = {k: statistics.median(v) for k, v in results.items()}
    out["otel-train phase(), its replay"] = replay_ns[0] / (repeats * (n // 1000) * 1000)
    return out


# -- 2. whole training steps -----------------------------------------------------------------

AUTO = "otel-train (zero-code hooks)"


def make_job(hidden: int, batch: int, n_batches: int) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = torch.utils.data.TensorDataset(
        torch.randn(batch * n_batches, 784), torch.randint(0, 10, (batch * n_batches,))
    )
    loader = torch.utils.data.DataLoader(ds, batch_size=batch)
    return model, opt, loader


def plain_steps(
    model: Any, opt: Any, loader: Any, steps: int, ends: list[int] | None = None
) -> None:
    loss_fn = torch.nn.functional.cross_entropy
    done = 0
    while done < steps:
        for x, y in loader:
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if ends is not None:
                ends.append(time.perf_counter_ns())
            done += 1
            if done == steps:
                return


def span_steps(
    model: Any, opt: Any, loader: Any, steps: int, tracer: Any, ends: list[int] | None = None
) -> None:
    loss_fn = torch.nn.functional.cross_entropy
    done = 0
    while done < steps:
        it = iter(loader)
        while True:
            with tracer.start_as_current_span("step"):
                with tracer.start_as_current_span("data"):
                    try:
                        x, y = next(it)
                    except StopIteration:
                        break
                with tracer.start_as_current_span("forward"):
                    loss = loss_fn(model(x), y)
                with tracer.start_as_current_span("backward"):
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                with tracer.start_as_current_span("optimizer"):
                    opt.step()
            if ends is not None:
                ends.append(time.perf_counter_ns())
            done += 1
            if done == steps:
                return


def steps_bench(steps: int, rounds: int, hidden: int, batch: int) -> dict[str, Any]:
    """Chunks of ``steps`` steps per variant, variants rotated within each round.

    Short chunks interleaved over many rounds keep slow phases of the (shared, virtual)
    machine from landing on one variant. One otel-train session lives through the whole
    run, as in training; the model is instrumented for its chunks only, and each of its
    chunks ends when the worker has processed every step.
    """
    model, opt, loader = make_job(hidden, batch, 64)
    tp_spans = sdk_tracer_provider()
    span_tracer = tp_spans.get_tracer("bench")
    tp_ours = sdk_tracer_provider()
    mp, _ = in_memory_meter_provider()
    otel_train.configure(tracer_provider=tp_ours, meter_provider=mp, console="off")
    sess = session.current()
    assert sess is not None

    step_ns: dict[str, list[int]] = {}  # every step's own duration, per variant
    worker_ns = [0]  # the worker's CPU time over otel-train's chunks

    def durations(name: str, start: int, ends: list[int]) -> None:
        starts = [start, *ends[:-1]]
        step_ns.setdefault(name, []).extend(b - a for a, b in zip(starts, ends, strict=True))

    def run_plain() -> tuple[int, int]:
        ends: list[int] = []
        w, c = time.perf_counter_ns(), time.process_time_ns()
        plain_steps(model, opt, loader, steps, ends)
        out = time.perf_counter_ns() - w, time.process_time_ns() - c
        durations("plain", w, ends)
        return out

    def run_ours() -> tuple[int, int]:
        inst = otel_train.instrument(model, optimizer=opt, dataloader=loader)
        before = sess.worker.steps_processed
        cpu_before = sess.worker._cpu_ns
        ends: list[int] = []
        w, c = time.perf_counter_ns(), time.process_time_ns()
        plain_steps(model, opt, loader, steps, ends)
        while sess.recorder.has_work():  # count the worker's processing of every step
            sess.worker.process()
        out = time.perf_counter_ns() - w, time.process_time_ns() - c
        inst.uninstrument()
        durations("otel-train (default)", w, ends)
        worker_ns[0] += sess.worker._cpu_ns - cpu_before
        assert sess.worker.steps_processed - before == steps
        return out

    def run_auto() -> tuple[int, int]:
        # The zero-code path: torch's process-wide hooks (what opentelemetry-instrument
        # installs through the otel_train entry point), on the same session.
        from otel_train.instrumentor import OtelTrainInstrumentor

        inst = OtelTrainInstrumentor()
        inst.instrument()
        before = sess.worker.steps_processed
        ends: list[int] = []
        w, c = time.perf_counter_ns(), time.process_time_ns()
        plain_steps(model, opt, loader, steps, ends)
        while sess.recorder.has_work():
            sess.worker.process()
        out = time.perf_counter_ns() - w, time.process_time_ns() - c
        inst.uninstrument()
        durations(AUTO, w, ends)
        assert sess.worker.steps_processed - before == steps
        return out

    def run_spans() -> tuple[int, int]:
        ends: list[int] = []
        w, c = time.perf_counter_ns(), time.process_time_ns()
        span_steps(model, opt, loader, steps, span_tracer, ends)
        out = time.perf_counter_ns() - w, time.process_time_ns() - c
        durations("OTel SDK span per phase", w, ends)
        return out

    variants = {
        "plain": run_plain,
        "otel-train (default)": run_ours,
        "OTel SDK span per phase": run_spans,
    }
    if importlib.util.find_spec("opentelemetry.instrumentation") is not None:
        variants[AUTO] = run_auto  # pip install 'otel-train[auto]'
    plain_steps(model, opt, loader, 50)  # warm up
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        # A palindrome (A B C C B A, rotated per round): every variant's two chunks sit at
        # the same mean position, so drift and "the chunk after a switch is slower" effects
        # (seen here: +37 us/step between two identical plain chunks) cancel.
        names = list(variants)
        names = names[r % len(names) :] + names[: r % len(names)]
        got: dict[str, list[tuple[int, int]]] = {k: [] for k in variants}
        for name in names + names[::-1]:
            got[name].append(variants[name]())
        for name, pair in got.items():
            wall[name].append(sum(w for w, _ in pair) / len(pair) / steps / 1e3)
            cpu[name].append(sum(c for _, c in pair) / len(pair) / steps / 1e3)
    traced = sess.worker.emitter.emitted if sess.worker.emitter else 0
    otel_train.shutdown()
    tp_spans.shutdown()
    tp_ours.shutdown()
    return {
        "wall": wall,
        "cpu": cpu,
        "spans": traced,
        "steps": steps * rounds,
        "step_ns": step_ns,
        # two chunks of otel-train per round
        "worker_us": worker_ns[0] / (2 * steps * rounds) / 1e3,
    }


def paired_delta(a: list[float], b: list[float]) -> float:
    return statistics.median(x - y for x, y in zip(a, b, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50, help="steps per chunk")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--hidden", type=int, default=448)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--micro-n", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"cuda {torch.cuda.is_available()}"
    )
    m = micro(args.micro_n, 9)
    floor = m["perf_counter_ns pair (floor)"]
    print("\n1. Per phase on the training thread (ns, median of rounds)")
    print(f"{'variant':<32}{'ns/phase':>10}{'x floor':>9}")
    for name, ns in m.items():
        print(f"{name:<32}{ns:>10.0f}{ns / floor:>9.1f}")

    res = steps_bench(args.steps, args.rounds, args.hidden, args.batch)
    wall, cpu = res["wall"], res["cpu"]
    base_w = statistics.median(wall["plain"])
    print(
        f"\n2. Training steps: MLP 784-{args.hidden}-{args.hidden}-10, batch {args.batch}, "
        f"chunks of {args.steps} steps, {args.rounds} rounds of A B C C B A (us per step)"
    )
    print(
        f"{'variant':<28}{'wall':>9}{'cpu':>9}{'wall delta':>12}{'cpu delta':>11}{'% of step':>11}"
    )
    deltas = {}
    for name in wall:
        dw = paired_delta(wall[name], wall["plain"])
        dc = paired_delta(cpu[name], cpu["plain"])
        deltas[name] = (dw, dc)
        print(
            f"{name:<28}{statistics.median(wall[name]):>9.1f}{statistics.median(cpu[name]):>9.1f}"
            f"{dw:>12.1f}{dc:>11.1f}{100 * dw / base_w:>10.2f}%"
        )
    print(
        f"otel-train traced {res['spans']} spans over {res['steps']} instrumented steps "
        "(default sampling)"
    )
    # A second estimate, less exposed to the machine's drift: the median of single steps
    # (steps the worker interrupted fall out of it) plus the worker's own CPU per step.
    med = {k: statistics.median(v) / 1e3 for k, v in res["step_ns"].items()}
    base_m = med["plain"]
    print(
        "\n3. Median single step (us) and its delta; otel-train's worker CPU per step "
        "measured on its thread and added"
    )
    print(f"{'variant':<28}{'median':>9}{'delta':>9}{'worker':>9}{'total':>9}{'% of step':>11}")
    for name, m in med.items():
        worker = res["worker_us"] if name == "otel-train (default)" else 0.0
        total = m - base_m + worker
        print(
            f"{name:<28}{m:>9.1f}{m - base_m:>9.1f}{worker:>9.1f}{total:>9.1f}"
            f"{100 * total / base_m:>10.2f}%"
        )
    ours_m = med["otel-train (default)"] - base_m + res["worker_us"]
    spans_m = med["OTel SDK span per phase"] - base_m
    print(
        f"ratio by this estimate: {ours_m / spans_m:.3f}; {100 * ours_m / base_m:.2f}% of the step"
    )
    ours_w = deltas["otel-train (default)"][0]
    spans_w = deltas["OTel SDK span per phase"][0]
    print(
        f"\nratio otel-train / span-per-phase (wall delta): {ours_w / spans_w:.3f}  "
        f"(target <= 0.1); otel-train overhead {100 * ours_w / base_w:.2f}% of the "
        f"{base_w / 1000:.2f} ms step (target < 1%)"
    )


if __name__ == "__main__":
    main()
