"""Tail latency of training steps: plain against otel-train, one process per run.

Each process trains a 64-256-64 MLP (batch 32, SGD, one torch thread, about 0.3 ms a
step), warms up for ``--warmup`` steps and at least ``--warmup-seconds`` (a long run's
steady state: the sidecar process starts in about 2 s), then records the wall time of
every one of ``--steps`` steps (``zero_grad`` to the end of ``optimizer.step()``; the
loader's fetch, timed by otel-train as the data phase, is outside it) and every
generation-2 garbage collection (``gc.callbacks``). Variants run interleaved, one fresh
process each, ``--rounds`` times:

- ``plain``: no telemetry;
- ``plain-again``: a second plain process in the same round, the machine's noise floor:
  its ratios to ``plain`` are what two identical runs differ by here, and a target
  tighter than them cannot be read off this machine;
- ``default``: ``otel_train.instrument()`` at defaults with no endpoint (console tables
  to a discarded stderr, ``/metrics`` on a free port);
- ``otlp``: the same, exporting OTLP/HTTP to the Collector of ``scripts/stack``;
- ``otlp-all``: ``otlp`` with ``trace_steps="all"``;
- ``app``: the application's own providers (an SDK ``TracerProvider`` and
  ``MeterProvider`` exporting OTLP/HTTP, passed to ``instrument()``): the configuration of
  every application that set up OpenTelemetry before otel-train;
- ``profile``: ``default`` with ``profile_steps`` switched on over a window past the
  measured steps: the configuration of a debugging run outside its window (until this
  round it kept the consumer side on a thread of the training process; inside the
  window torch.profiler's own cost is the point, and is not measured here);
- ``default-thread``, ``otlp-all-thread`` (not run unless named in ``--variants``): the
  same with ``sidecar="off"``, the worker on a thread of the training process.

It prints p50, p99, p99.9 and the worst step of each variant with its ratio to the
same round's plain run, and the generation-2 collections beside plain's: on the wall
clock, and on the training thread's CPU clock (``time.thread_time_ns``), which counts
the work done on the training thread and not the time it waited for a CPU while other
processes (the sidecar, the stack's servers, anything else) ran. The OTLP
variants need an OTLP endpoint: ``--receiver`` starts benchmarks/otlp_sink.py on
loopback (on the other CPUs with ``--pin``), a small receiver that answers as a Collector
does at a fraction of the stack's CPU; else the stack's Collector (``scripts/stack up``)
or ``--endpoint``; they are skipped with a note when nothing listens there. After the
rounds, each variant's figures are decided on its median round (the median of its
per-round ratios), beside plain-again's: a target tighter than plain-again's median
cannot be read off this machine. Nothing here asserts: the targets are read off the
figures.

``--pin`` places the processes as a training node does: every training process (plain
and instrumented alike) on CPU 0, and what serves telemetry on the other CPUs (each
run's sidecar process, and the Collector, Jaeger and Prometheus of ``scripts/stack``).
Without it every process floats over all CPUs; on a 2-CPU machine the stack's servers
then take turns on the training core, which a node with more cores (or the Collector on
another node) does not see.

Usage: python benchmarks/tail.py [--rounds 5] [--steps 10000] [--warmup 500]
       [--warmup-seconds 5] [--pin] [--receiver]
       [--variants plain,plain-again,default,otlp,otlp-all,app]
       [--endpoint http://127.0.0.1:4318]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

VARIANTS = (
    "plain",
    "plain-again",
    "default",
    "otlp",
    "otlp-all",
    "app",
    "profile",
    "default-thread",
    "otlp-all-thread",
)
QUANTILES = (("p50", 0.50), ("p99", 0.99), ("p99.9", 0.999))


def _env(variant: str, endpoint: str, extra: list[str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_PROMETHEUS_PORT"] = "0"  # never clash with a running job or stack
    if variant.startswith("otlp") or variant == "app":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        env["OTEL_SERVICE_NAME"] = f"tail-{variant}"
    if variant.startswith("otlp-all"):
        env["OTEL_TRAIN_TRACE_STEPS"] = "all"
    if variant == "profile":  # (the window lies past every measured step)
        env["OTEL_TRAIN_PROFILE_STEPS"] = "1000000-1000001"
    if variant.endswith("-thread"):
        env["OTEL_TRAIN_SIDECAR"] = "off"  # the worker on a thread of this process
    for item in extra:
        key, _, value = item.partition("=")
        env[key] = value
    return env


_CPUS = set(os.sched_getaffinity(0))  # (read before ``--pin`` narrows this process's)


def _other_cpus() -> set[int]:
    """Every CPU this process may use but CPU 0 (where ``--pin`` puts training)."""
    return _CPUS - {0}


def _move_process(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (sched_setaffinity moves one thread: the
    sidecar's threads, started before it, would stay on the training CPU)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            continue


def _pin_stack() -> str:
    """Move the running stack's servers off CPU 0; says what moved."""
    stack = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "stack")
    out = subprocess.run([sys.executable, stack, "status", "--json"], check=False,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        services = json.loads(out.stdout).get("services", {})
    except ValueError:
        services = {}
    moved = []
    for name, svc in services.items():
        try:
            _move_process(int(svc["pid"]), _other_cpus())
            moved.append(name)
        except (KeyError, OSError, ValueError):
            continue
    return ", ".join(moved) or "none running"


def mlp() -> tuple[Any, Any, Any]:
    """The measured loop's parts: a 64-256-64 MLP, SGD, batches of 32, one torch thread
    (pump_cpu.py trains the same)."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randn(4096, 64))
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True, drop_last=True)
    return model, opt, loader


def _providers(variant: str) -> dict[str, Any]:
    """The application's own SDK providers (variant ``app``), exporting OTLP/HTTP to the
    endpoint of the environment as an application would configure them."""
    if variant != "app":
        return {}
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(), export_interval_millis=5000)
    return {"tracer_provider": tracer_provider,
            "meter_provider": MeterProvider(metric_readers=[reader])}  # fmt: skip


def one(
    variant: str, steps: int, warmup: int, warmup_s: float, pin: bool = False
) -> dict[str, Any]:
    """One process's run: every step's duration (ns) and its generation-2 collections."""
    if pin:  # (before torch starts a thread: threads inherit the creator's CPUs)
        os.sched_setaffinity(0, {0})
    import torch

    model, opt, loader = mlp()
    if not variant.startswith("plain"):
        import otel_train

        otel_train.instrument(model, optimizer=opt, dataloader=loader, **_providers(variant))
        session = otel_train.session.current()
        feeder = getattr(session, "feeder", None)
        if pin and feeder is not None:
            _move_process(feeder.process.proc.pid, _other_cpus())
    gen2: list[int] = []
    pc = time.perf_counter_ns

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            gen2.append(pc())

    gc.callbacks.append(on_gc)
    durations = [0] * steps
    cpu = [0] * steps  # the training thread's own CPU time per step
    tt = time.thread_time_ns
    loss_fn = torch.nn.functional.mse_loss
    done = -warmup
    t_start = 0
    warm_until = pc() + int(warmup_s * 1e9)
    while done < steps:
        for x, y in loader:  # an epoch's end is inside the timing, as in training
            t0, c0 = pc(), tt()
            if done == -1 and t0 < warm_until:
                done = -2  # warm up for warmup_s too (the sidecar starts meanwhile)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            t1, c1 = pc(), tt()
            if done >= 0:
                if done == 0:
                    t_start = t0
                durations[done] = t1 - t0
                cpu[done] = c1 - c0
            done += 1
            if done >= steps:
                break
    t_end = pc()
    gc.callbacks.remove(on_gc)
    return {
        "durations": durations,
        "cpu": cpu,
        "gen2": sum(1 for t in gen2 if t >= t_start),
        "run_s": (t_end - t_start) / 1e9,
    }


def _listening(endpoint: str) -> bool:
    parts = urlsplit(endpoint)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 4318), 1):
            return True
    except OSError:
        return False


def _quantile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3


def _figures(run: dict[str, Any], clock: str = "durations") -> dict[str, float]:
    durations = run[clock]
    figures = {name: _quantile(durations, q) for name, q in QUANTILES}
    figures["max"] = max(durations) / 1e3
    figures["gen2"] = run["gen2"]
    return figures


def _print_rows(round_no: int, clock: str, variants: list[str], runs: dict[str, Any]) -> None:
    """One round's rows on one clock: wall time (``durations``) or the training thread's
    CPU time (``cpu``: the work done on it, without the waits for a CPU that other
    processes cause), each with its ratios to plain's on the same clock."""
    base = _figures(runs["plain"], clock)
    for variant in variants:
        fig = _figures(runs[variant], clock)
        cells = ""
        for name in ("p50", "p99", "p99.9"):
            cells += f"{fig[name]:>10.1f} {fig[name] / base[name]:>5.2f}x "
        extra = fig["max"] - base["max"]
        cells += f"{fig['max']:>10.1f} {extra / 1e3:>+5.1f}ms"
        label = "wall" if clock == "durations" else "cpu"
        print(f"{round_no:<6}{label:<6}{variant:<12}{cells}{fig['gen2']:>11}"
              f"{runs[variant]['run_s']:>8.2f}")  # fmt: skip


def _decide(variants: list[str], rounds: list[dict[str, Any]]) -> None:
    """Each variant on its median round: the median of its per-round ratios to the same
    round's plain (and of its worst step's excess), beside plain-again's, the noise floor."""
    print("\ndecided on the median round (wall clock; ratios to the same round's plain):")
    print(f"{'variant':<16}{'p99':>8}{'p99.9':>8}{'max':>10}{'gen-2':>7}  targets met")
    for variant in variants[1:]:
        p99, p999, extra, gen2 = [], [], [], []
        for runs in rounds:
            base, fig = _figures(runs["plain"]), _figures(runs[variant])
            p99.append(fig["p99"] / base["p99"])
            p999.append(fig["p99.9"] / base["p99.9"])
            extra.append((fig["max"] - base["max"]) / 1e3)
            gen2.append(fig["gen2"] - base["gen2"])
        m99, m999, mx, mg = (statistics.median(v) for v in (p99, p999, extra, gen2))
        met = [name for name, ok in (("p99", m99 <= 1.05), ("p99.9", m999 <= 1.10),
                                     ("max", mx <= 1.0), ("gen-2", mg <= 0)) if ok]  # fmt: skip
        print(f"{variant:<16}{m99:>7.2f}x{m999:>7.2f}x{mx:>+8.2f}ms{mg:>+7.0f}  "
              f"{', '.join(met) or 'none'}")  # fmt: skip


def _receiver(pin: bool) -> tuple[subprocess.Popen[str], str]:
    """benchmarks/otlp_sink.py on a free loopback port (off CPU 0 with ``--pin``)."""
    sink = os.path.join(os.path.dirname(os.path.abspath(__file__)), "otlp_sink.py")
    proc = subprocess.Popen([sys.executable, sink], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = proc.stdout.readline().split()[1]
    if pin:
        os.sched_setaffinity(proc.pid, _other_cpus())
    return proc, f"http://127.0.0.1:{port}"


def _spawn(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--one", variant, "--steps", str(args.steps),
         "--warmup", str(args.warmup), "--warmup-seconds", str(args.warmup_seconds),
         *(["--pin"] if args.pin else [])],
        check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=_env(variant, args.endpoint, args.env if not variant.startswith("plain") else []),
    )  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--warmup-seconds", type=float, default=5.0)
    ap.add_argument("--variants", default="plain,plain-again,default,otlp,otlp-all,app")
    ap.add_argument("--receiver", action="store_true",
                    help="the OTLP variants export to benchmarks/otlp_sink.py")  # fmt: skip
    ap.add_argument("--endpoint", default="http://127.0.0.1:4318")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for the instrumented variants")  # fmt: skip
    ap.add_argument("--pin", action="store_true",
                    help="training on CPU 0; sidecars, stack servers on the others")  # fmt: skip
    ap.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.steps, args.warmup, args.warmup_seconds, args.pin)))
        return
    if args.pin and not _other_cpus():
        ap.error("--pin: needs a second CPU for the telemetry side")
    wanted = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(wanted) - set(VARIANTS))
    if unknown:
        ap.error(f"--variants: unknown {unknown}; accepted: {', '.join(VARIANTS)}")
    sink = None
    if args.receiver:
        sink, args.endpoint = _receiver(args.pin)
        print(f"OTLP into benchmarks/otlp_sink.py at {args.endpoint}")
    exports = [v for v in wanted if v.startswith("otlp") or v == "app"]
    if exports and not _listening(args.endpoint):
        print(f"nothing listens at {args.endpoint} (scripts/stack up): {exports} skipped")
        wanted = [v for v in wanted if v not in exports]
    variants = ["plain", *[v for v in wanted if v != "plain"]]
    if args.pin:
        print(f"pinned: training on CPU 0; sidecars and the stack ({_pin_stack()}) on CPUs "
              f"{sorted(_other_cpus())}")  # fmt: skip
    print(f"{args.rounds} rounds, one process per variant, {args.steps} timed steps each "
          f"after {args.warmup} warm-up steps and at least {args.warmup_seconds} s "
          "(us; ratio to the same round's plain)")  # fmt: skip
    header = f"{'round':<6}{'clock':<6}{'variant':<12}" + "".join(
        f"{name:>18}" for name in ("p50", "p99", "p99.9", "max")
    )
    print(header + f"{'gen-2 GCs':>11}{'run s':>8}")
    rounds = []
    for r in range(args.rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        runs = {v: _spawn(v, args) for v in order}
        rounds.append(runs)
        for clock in ("durations", "cpu"):
            _print_rows(r + 1, clock, variants, runs)
        sys.stdout.flush()
    print("targets: p99 <= 1.05x, p99.9 <= 1.10x, max <= plain's + 1 ms, "
          "gen-2 GCs <= plain's")  # fmt: skip
    _decide(variants, rounds)
    if sink is not None:
        sink.terminate()
        sink.wait(10)


if __name__ == "__main__":
    main()
