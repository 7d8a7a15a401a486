"""The sidecar process: ``python -m otel_train.sidecar``, started by the training
process's :class:`~.feeder.Feeder`.

It builds otel-train's own SDK (OTLP exporters, the ``/metrics`` endpoint on the socket
the training process bound), runs the worker, the console tables, the trace sampler
and the efficiency figures on what arrives on stdin, and answers on stdout. Its GIL,
its garbage collections and its export calls are its own: the training thread never
waits for them. It ends at the training process's ``END`` message or at the end of its
stdin (the training process died), either way with the summary and a bounded flush.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from ..export.resource import rank
from ..export.setup import Telemetry, build_own
from ..handover import wire
from ..processing.blocks import StepBlock
from ..processing.efficiency import EfficiencyTracker
from ..processing.hangs import Progress
from ..processing.instruments import ProcessMemory, rss_bytes
from ..processing.source import Delivery
from ..recording.regions import RegionLog
from ..settings import ConfigError
from ..wiring import build_consumer
from .relay import METRICS_S, RelayEmitter, RelayLoggerProvider, RelayOut, send_metrics
from .replica import RemoteSource

_log = logging.getLogger("otel_train")
NICE = 10  # the sidecar's niceness: CFS gives a nice-0 trainer ~90% of a shared core
# Bytes read from the pipe at a time: what is read is decoded before it is applied, so a
# backlog in the pipe (1 MiB) read at once held every entry in it as objects here.
READ_BYTES = 1 << 16


class RemoteProbe:
    """The efficiency tracker's view of the training process's FLOP probe."""

    def __init__(self, out: Any) -> None:
        self._out = out
        self.results: collections.deque[Any] = collections.deque(maxlen=64)
        self.armed = True  # the probe starts armed (the settings' count step)
        self.failed = False

    def arm(self, at_index: int = 0) -> None:
        self.armed = True
        self._out((wire.ARM, at_index))

    def abort(self) -> None:
        pass  # the training process aborts its own probe at shutdown


class RemoteHangs:
    """The hang watch's view of the training process from here (processing/hangs.py): its
    progress as the feeder's thread last told it, or as the steps and log entries that
    arrived since show (a process frozen between two words of its feeder, SIGSTOP for
    one, still has its latest boundary known here), and details asked for over the pipe."""

    def __init__(self, out: Any, source: RemoteSource) -> None:
        self._out = out
        self._source = source
        self.latest: Progress | None = None
        self.seen_ns = 0  # the newest step end that arrived in a delivery
        self.watch: Any = None  # the HangWatch, set by wiring.build_consumer

    def progress(self) -> Progress | None:
        latest = self.latest
        seen = max(self.seen_ns, self._source.replica.progress_ns())
        if latest is None:
            return Progress(seen, None, False) if seen else None
        return latest._replace(ns=seen) if seen > latest.ns else latest

    def arrived(self, delivery: Delivery) -> None:
        for part in delivery.parts:
            if part:
                end = part.last_end() if isinstance(part, StepBlock) else part[-1].t1
                self.seen_ns = max(self.seen_ns, end)

    def ask(self, age: float, limit: float) -> None:
        self._out((wire.HANG_PROBE, age, limit))

    def told(self, progress: tuple[Any, ...], details: dict[str, Any] | None = None) -> None:
        self.latest = Progress(*progress)
        if details is not None and self.watch is not None:
            self.watch.report(details)


class Agent:
    def __init__(self, hello: tuple[Any, ...], out: Any) -> None:
        _, settings, version, offset_ns, _parent, record = hello
        self.settings = settings
        self._out = out
        relay_fd = os.environ.get("OTEL_TRAIN_SIDECAR_RELAY_FD")
        # The application's providers (in the training process): the relay hands them
        # what this process makes (relay.py); else this process exports itself.
        self.relay = RelayOut(int(relay_fd)) if relay_fd else None
        if self.relay is not None:
            self.telemetry = Telemetry(None, None, None,
                                       logger_provider=RelayLoggerProvider(self.relay))  # fmt: skip
        else:
            fd = os.environ.get("OTEL_TRAIN_SIDECAR_METRICS_FD")
            sock = socket.socket(fileno=int(fd)) if fd else None
            self.telemetry = build_own(settings, version, sock, record, consumer="sidecar")
        ring = None
        told = os.environ.get("OTEL_TRAIN_SIDECAR_RING")  # "fd:capacity" (process.py)
        if told:
            fd, capacity = told.split(":")
            ring = (int(fd), int(capacity))
        self.source = RemoteSource(settings, out, ring)
        self.regions = RegionLog()
        counting = settings.flops == "count" and settings.flops_per_step is None
        self.probe = RemoteProbe(out) if counting else None
        self.efficiency = EfficiencyTracker(
            settings, None, self.regions, settings.throughput_window, probe=self.probe
        )
        self.efficiency.model_facts = (0, "fp32", None)  # until the first delivery's
        self.hangs = RemoteHangs(out, self.source)
        consumer = build_consumer(
            settings, self.telemetry, self.source, self.efficiency, version, rank(), offset_ns,
            hangs=self.hangs,
        )  # fmt: skip
        self.worker = consumer.worker
        if consumer.publisher is not None:  # (process metrics: the training process's)
            consumer.publisher.memory = self._trainer_memory
        if self.relay is not None:
            # (SpanEmitter's interface: the worker calls emit() and emit_remote())
            self.worker.emitter = RelayEmitter(self.relay, offset_ns)  # type: ignore[assignment]
            self.worker.export_drops = self.relay.drop_counts
            threading.Thread(target=self._send_metrics, name="otel-train-relay",
                             daemon=True).start()  # fmt: skip
        self.worker.start()

    def _trainer_memory(self) -> ProcessMemory:
        """The training process's memory, as its last delivery said."""
        counters = self.worker.counters
        return ProcessMemory(counters.rss_bytes, counters.peak_rss_bytes)

    def _send_metrics(self) -> None:
        """The relay's metrics, every METRICS_S (relay.py)."""
        relay = self.relay
        assert relay is not None
        while not relay.gone:
            time.sleep(METRICS_S)
            send_metrics(relay, self.worker.agg)

    def handle(self, message: tuple[Any, ...]) -> bool:
        """Apply one message; False at the end."""
        kind = message[0]
        if not self.worker.shedding and self.source.past_drain():
            self.worker.shedding = True  # (the training process is ending: see replica.py)
        if kind == wire.DELIVERY:
            _, _, _, _, regions, counts, probe_state, facts = message
            if facts is not None:
                self.efficiency.take_facts(facts)
            if self.probe is not None:
                self.probe.results.extend(counts)
                if probe_state is not None:
                    self.probe.armed, self.probe.failed = probe_state
            self.regions.done.extend(regions)
            delivery = wire.decode_delivery(message)
            self.hangs.arrived(delivery)
            self.source.push(delivery)
        elif kind == wire.RING:
            self.source.ring(*message[1:])
        elif kind == wire.RAW_BEGIN:
            self.source.raw_begin(*message[1:])
        elif kind == wire.RAW_END:
            self.source.raw_end(message[1])
        elif kind == wire.FLUSH:
            ok = self.flush(message[2])
            self._out((wire.FLUSHED, message[1], self.stats(), ok))
        elif kind == wire.FIRST:
            self.worker.sampler.trace_first_from(message[1])
        elif kind == wire.PROGRESS:
            self.hangs.told(message[1])
        elif kind == wire.HANG_DETAILS:
            self.hangs.told(message[2], message[1])
        elif kind == wire.CONSOLE_TO:  # (the worker's thread reads it at its next print)
            self.worker.console.sink = self._hand_back if message[1] else None
        elif kind == wire.END:
            self.end(message[1])
            return False
        return True

    def _hand_back(self, text: str) -> None:
        """A console table or the summary, for the training process to print."""
        self._out((wire.CONSOLE, text))

    def flush(self, timeout_s: float) -> bool:
        """Every step that arrived in the metrics, its spans exported; bounded (with the
        relay: sent back, the training process flushes its providers itself)."""
        deadline = time.monotonic() + timeout_s
        self.worker.process_waiting(deadline)
        if self.relay is not None:  # (all of it in the pipe before the answer)
            send_metrics(self.relay, self.worker.agg)
            self._drain_relay(deadline)
            return not self.relay.pending
        t = self.telemetry
        result: list[bool] = []

        def force() -> None:
            result.append(t.flush(deadline))

        # The SDK's flush can outlive its timeout (retries while the collector is down):
        # this thread answers at the deadline and goes on reading the pipe.
        thread = threading.Thread(target=force, name="otel-train-flush", daemon=True)
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()))
        return bool(result and result[0])

    def stats(self) -> dict[str, Any]:
        """This process's figures, for the training process (benchmarks, tests)."""
        return {
            "export_drops": (self.relay or self.telemetry).drop_counts(),
            "rss_bytes": rss_bytes(),
            "steps": self.worker.steps_processed,
            "torch_imported": "torch" in sys.modules,  # (it never should be: issue 24)
            "modules": len(sys.modules),
        }

    def end(self, budget_s: float) -> None:
        deadline = time.monotonic() + max(0.0, budget_s - 0.2)  # kept for the exit itself
        self.source.finish()
        now = time.monotonic()
        # Half the budget to process what is left, then counting the rest as dropped
        # until a quarter is left for the summary and the flush.
        self.worker.stop(now + (deadline - now) / 2, now + 3 * (deadline - now) / 4)
        if self.settings.console != "off":
            try:
                self.worker.console.print_summary()
            except Exception:
                _log.exception("otel-train: printing the run summary failed")
        if self.relay is not None:
            send_metrics(self.relay, self.worker.agg)
            self._drain_relay(deadline)
        exported = self.telemetry.shutdown(max(0.0, deadline - time.monotonic()))
        # (anything dropped, the export's own drops included: shutdown() says False)
        self.in_time = exported and not self.worker.drops()

    def _drain_relay(self, deadline: float) -> None:
        """What the relay's pipe has not taken yet, before this process exits."""
        relay = self.relay
        assert relay is not None
        while relay.pending and not relay.gone and time.monotonic() < deadline:
            relay.write()
            time.sleep(0.005)


def lower_priority() -> None:
    """Training comes first when both want a core. The sidecar runs in a session of its
    own (Ctrl-C is the trainer's), and where the kernel groups tasks by session
    (``sched_autogroup``, on by default in most distributions) CFS shares a core between
    the groups as equals whatever a task's own niceness: the group's niceness has to be
    raised too (``/proc/self/autogroup``), or the sidecar takes half of a shared core."""
    with contextlib.suppress(OSError):
        os.nice(NICE)
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
        f.write(str(NICE))


def _protocol_out() -> Any:
    """The pipe to the training process, on a descriptor of its own: fd 1 (what print()
    and console="stdout" write to) becomes the training process's stdout, else stderr."""
    sys.stdout.flush()
    pipe = os.fdopen(os.dup(1), "wb")
    console = os.environ.get("OTEL_TRAIN_SIDECAR_STDOUT_FD")
    if console:
        os.dup2(int(console), 1)
        os.close(int(console))
    else:
        os.dup2(2, 1)
    return pipe


def main() -> None:
    # Signals to the training job are the trainer's: it tells us when to end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lower_priority()
    logging.basicConfig(format="%(message)s")
    write_lock = threading.Lock()
    stdout = _protocol_out()
    frames = wire.FrameWriter()

    def out(message: tuple[Any, ...]) -> None:
        with write_lock:
            try:
                stdout.write(frames.frame(message))
                stdout.flush()
            except OSError:
                pass  # the training process is gone

    reader = wire.FrameReader()
    stdin = sys.stdin.buffer.fileno()
    agent: Agent | None = None
    in_time = True
    while True:
        data = os.read(stdin, READ_BYTES)
        if not data:  # the training process ended without END: flush what arrived
            if agent is not None:
                agent.end(agent.settings.shutdown_timeout)
                in_time = agent.in_time
            break
        done = False
        for message in reader.feed(data):
            if agent is None:
                try:
                    agent = Agent(message, out)
                except ConfigError as err:
                    out((wire.FAILED, "config", str(err)))
                    os._exit(2)
                except Exception as err:
                    out((wire.FAILED, "error", f"{type(err).__name__}: {err}"))
                    os._exit(2)
                out((wire.READY,))
                continue
            if not agent.handle(message):
                in_time = agent.in_time
                done = True
                break
        if done:
            break
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if in_time else 3)  # exporter threads may linger: shutdown was bounded
