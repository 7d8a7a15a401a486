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
import dataclasses
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
from ..processing.blocks import Shape, StepBlock
from ..processing.efficiency import EfficiencyTracker
from ..processing.hangs import Progress
from ..processing.instruments import rss_bytes
from ..processing.source import Counters, Delivery, StepSource, finished
from ..recording.recorder import Recorder
from ..recording.regions import RegionLog
from ..recording.templates import Template
from ..settings import ConfigError
from ..wiring import build_consumer
from . import wire
from .relay import METRICS_S, RelayEmitter, RelayLoggerProvider, RelayOut, send_metrics
from .wire import replica_stacks, stack_of

_log = logging.getLogger("otel_train")
_REPLICA = Counters()  # marks the replica's deliveries: the counters are the trainer's
NICE = 10  # the sidecar's niceness: CFS gives a nice-0 trainer ~90% of a shared core
REPORT_S = 0.05  # seconds between applying raw entries and reporting the idle point
# Finished steps received and not yet taken by the worker: past this many the oldest
# deliveries are dropped and counted (dropped{reason="sidecar"}), as the training process's
# feeder drops what its pipe cannot take. A worker that keeps up takes a backlog every
# 50 ms once 64 deliveries wait (250 steps of a 5k steps/s loop); each held step is ~1.5
# KiB as a resolved step, and 16384 of them broke the collector-down memory bound.
MAX_HELD_STEPS = 1024
# Raw entries waiting in the replica's log: past this many they are applied at once, not
# at the next REPORT_S (a backlog read from the pipe would otherwise wait here whole).
MAX_RAW_WAITING = 4096
# Bytes read from the pipe at a time: what is read is decoded before it is applied, so a
# backlog in the pipe (1 MiB) read at once held every entry in it as objects here.
READ_BYTES = 1 << 16


class RemoteSource:
    """The worker's source here (source.py's interface): finished steps decoded from the
    pipe, and a replica recorder applying the log entries sent raw (raw.py)."""

    def __init__(self, settings: Any, out: Any) -> None:
        self._deliveries: collections.deque[Delivery] = collections.deque()
        self._held = 0  # finished steps in _deliveries
        self.dropped = 0  # steps dropped for the bound (MAX_HELD_STEPS)
        self.counters = Counters()
        self.disabled = False
        self._out = out
        self._lock = threading.Lock()
        self.replica = Recorder(settings, replay_only=True)
        self.replica.marks_idle = True
        self._replica_source = StepSource(self.replica)
        self.session: int | None = None
        self._appended = 0  # entries of this raw session appended to the replica's log
        self._reported = 0  # the last idle point of this raw session reported
        self._drained = 0.0
        self.shapes: dict[Any, Shape] = {}  # resolved steps' shapes (blocks.group_steps)

    def push(self, delivery: Delivery) -> None:
        with self._lock:
            if not self.disabled:
                self._hold(delivery)

    def _hold(self, delivery: Delivery) -> None:
        """Keep a delivery for the worker, dropping the oldest past MAX_HELD_STEPS (lock
        held): a worker that falls behind (this process yields its core to training)
        must not hold an unbounded backlog."""
        deliveries = self._deliveries
        deliveries.append(delivery)
        self._held += delivery.step_count()
        while self._held > MAX_HELD_STEPS and len(deliveries) > 1:
            n = deliveries.popleft().step_count()
            self._held -= n
            self.dropped += n

    def push_raw(self, session: int, entries: list[Any]) -> None:
        with self._lock:
            if self.disabled or session != self.session:
                return
            self.replica._log.extend(entries)
            self._appended += len(entries)
            # The training process keeps what was sent since the last idle point this
            # reports: apply and report every REPORT_S (not per message: this process's
            # CPU is the training node's too).
            now = time.monotonic()
            if now - self._drained >= REPORT_S or len(self.replica._log) >= MAX_RAW_WAITING:
                self._drained = now
                self._hold(self._replica_take(keep_partial=True))
                self._report_idle()

    def _replica_take(self, keep_partial: bool) -> Delivery:
        delivery = self._replica_source.take(derive=False, keep_partial=keep_partial)
        delivery.counters = _REPLICA  # the replica's own are added in take()
        return delivery

    def raw_begin(self, session: int, next_index: int, token: Any) -> None:
        with self._lock:
            rep = self.replica
            rep._next_index = next_index
            rep.step_stack = stack_of(token) if token is not None else None
            self.session, self._appended, self._reported = session, 0, 0

    def raw_end(self, session: int) -> None:
        """The training process caught up: keep the steps the entries finished, drop the
        step they leave open (it goes on there)."""
        with self._lock:
            if session != self.session:
                return
            self._hold(self._replica_take(keep_partial=False))
            rep = self.replica
            rep._current = None
            rep._scoped.clear()
            rep.reset_background()
            for stack in replica_stacks().values():
                stack.clear()
            self.session = None

    def take(self) -> Delivery:
        out = Delivery(counters=self.counters)
        with self._lock:
            if self.session is not None and self.replica._log:
                self._hold(self._replica_take(keep_partial=True))
                self._report_idle()
            deliveries, self._deliveries = self._deliveries, collections.deque()
            self._held = 0
        extra = self.replica
        for delivery in deliveries:
            for part in delivery.parts:
                if part:
                    out.parts.extend(finished(part, self.shapes, out.remote))
            out.scalars.extend(delivery.scalars)
            if delivery.counters is not _REPLICA:
                self.counters = delivery.counters
        c = self.counters
        out.counters = dataclasses.replace(
            c,
            dropped_phases=c.dropped_phases + extra.dropped_phases,
            dropped_handover=c.dropped_handover + self.dropped,
        )
        return out

    def _report_idle(self) -> None:
        """Tell the training process the last point of this raw session where the replica
        was idle: it lets go of what it sent up to there (raw.py)."""
        rep = self.replica
        mark = rep.idle_mark
        if mark is None:
            return  # (no idle point in what was applied: the last one reported stands)
        behind, next_index, stack = mark
        rep.idle_mark = None
        tokens = {id(v): k for k, v in replica_stacks().items()}
        position = self._appended - len(rep._log) - behind
        if position <= self._reported:
            return
        self._reported = position
        token = tokens.get(id(stack)) if stack is not None else None
        self._out((wire.IDLE, self.session, position, next_index, token))

    def finish(self) -> None:
        """The end: apply what the replica still holds, a partial last step included."""
        with self._lock:
            if self.session is not None:
                self._hold(self._replica_take(keep_partial=False))

    def has_work(self) -> bool:
        # (a partial step kept in the replica's log is not work until finish())
        return bool(self._deliveries)

    def backlog_due(self) -> bool:
        return len(self._deliveries) >= 64

    def disable(self) -> None:
        with self._lock:
            self.disabled = True
            self._deliveries.clear()
            self._held = 0


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
                end = part.last_end() if isinstance(part, StepBlock) else part[-1].host_end
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
            self.telemetry = build_own(settings, version, sock, record)
        self.source = RemoteSource(settings, out)
        self.templates: dict[int, Template] = {}
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
        if self.relay is not None:
            # (SpanEmitter's interface: the worker calls emit() and emit_remote())
            self.worker.emitter = RelayEmitter(self.relay, offset_ns)  # type: ignore[assignment]
            threading.Thread(target=self._send_metrics, name="otel-train-relay",
                             daemon=True).start()  # fmt: skip
        self.worker.start()

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
        if kind == wire.TEMPLATE:
            self.templates[message[1]] = message[2]
        elif kind == wire.DELIVERY:
            _, _, _, _, regions, counts, probe_state, facts = message
            if facts is not None:
                self.efficiency.model_facts = facts
                self.efficiency._params = None
            if self.probe is not None:
                self.probe.results.extend(counts)
                if probe_state is not None:
                    self.probe.armed, self.probe.failed = probe_state
            self.regions.done.extend(regions)
            delivery = wire.decode_delivery(message, self.templates)
            self.hangs.arrived(delivery)
            self.source.push(delivery)
        elif kind == wire.RAW:
            self.source.push_raw(message[1], message[2])
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
        self.worker.process()
        if self.relay is not None:
            send_metrics(self.relay, self.worker.agg)
            return True
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
            "export_drops": self.telemetry.drop_counts(),
            "rss_bytes": rss_bytes(),
            "steps": self.worker.steps_processed,
            "torch_imported": "torch" in sys.modules,  # (it never should be: issue 24)
            "modules": len(sys.modules),
        }

    def end(self, budget_s: float) -> None:
        deadline = time.monotonic() + max(0.0, budget_s - 0.2)  # kept for the exit itself
        self.source.finish()
        self.worker.stop(time.monotonic() + (deadline - time.monotonic()) / 2)
        if self.settings.console != "off":
            try:
                self.worker.console.print_summary()
            except Exception:
                _log.exception("otel-train: printing the run summary failed")
        if self.relay is not None:
            send_metrics(self.relay, self.worker.agg)
            self._drain_relay(deadline)
        self.in_time = self.telemetry.shutdown(max(0.0, deadline - time.monotonic()))

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

    def out(message: tuple[Any, ...]) -> None:
        with write_lock:
            try:
                stdout.write(wire.frame(message))
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
