"""The training process's end of the sidecar: finished steps out, requests in.

The recorder calls :meth:`Feeder.pump` on the training thread when its log passes a few
dozen entries (about every four steps of a plain loop). In a raw session (raw.py) the
hooks write the shared-memory ring instead, and the training thread pumps no more: the
sidecar reads how far the ring is written off its header (with the Python writer, a
pump tells it, also when 4,096 slots were not told), and a small thread of this feeder
tells it the side entries and new codes the slots name and reads its requests now and
then. With the device timed (a GPU job: each boundary's stamp in the ring's table,
recording/stamps.py) that thread also resolves the events every tick and tells the
sidecar how far they are resolved, with their times (event_times.py). Otherwise a pump
takes what finished (processing/source.py: boundaries applied, CUDA events resolved
when they completed) and encodes it (wire.py),
and the small thread pumps when the training thread has not for ``IDLE_PUMP_S`` (a
pause, the end of training). Frames go to the sidecar's stdin without waiting
(process.py); past ``MAX_BUFFER`` bytes waiting, deliveries are dropped and counted.
Nothing here waits but :meth:`flush` and :meth:`close`, each bounded by its deadline.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from ..identity import rank
from ..processing.efficiency import EfficiencyTracker
from ..processing.hang_details import LocalHangs, hang_label
from ..processing.instruments import own_memory
from ..processing.source import Counters, Delivery, StepSource
from ..recording.regions import RegionLog
from ..recording.ring import Ring, publish_drain_by
from ..settings import ConfigError, Settings
from ..wiring import prints_console
from . import wire
from .handback import ConsoleHandback
from .process import SidecarProcess
from .raw import RawHandover
from .relay_in import RelayIn

_log = logging.getLogger("otel_train")
PUMP_ENTRIES = 32  # log entries that make a pump due (a plain loop logs ~8 per step)
PUMP_STEPS = 4  # finished steps that make a pump due (the CUDA path, no log)
MAX_BUFFER = 8 << 20  # bytes waiting for the pipe before deliveries are dropped
CONTROL_EVERY = 16  # pumps between reads of the sidecar's requests (a syscall each)
WRITE_EVERY = 8  # pumps between writes to the pipe (a syscall each), unless WRITE_AT
WRITE_AT = 32 << 10
EXTRAS_EVERY = 16  # raw pumps between messages with counters, regions and FLOP counts
# The three fall on different pumps (control at 0, writes at 4 and 12, extras at 8 of
# every 16): together in one pump they made a lump of 200-500 us of the training
# thread's CPU (benchmarks/README.md, "Pump lumps").
WRITE_PHASE, EXTRAS_PHASE = 4, 8
TICK_S = 0.1  # how often the feeder's thread looks whether the training thread pumped
IDLE_PUMP_S = 0.2  # ... and pumps itself when it has not for this long
CONTROL_TICKS = 5  # in a shared ring's session, ticks between reads of the sidecar's words
START_TIMEOUT_S = 30.0  # for the sidecar to import and build its SDK (about 0.2 s)
PROGRESS_S = 1.0  # how often the feeder's thread tells the sidecar's hang watch the progress
PROGRESS_SHARE = 10  # ... and a change within a tenth of hang_after, if sooner (a tick a
# message with hang_after=1; a probe to answer goes at the next tick)
MEMORY_S = 1.0  # how often the feeder's thread reads this process's memory (the sidecar's
# process metrics are this process's: processing/instruments.py)


def _tell_within(hang_after: float | str) -> float:
    """How soon after the last word a changed progress is told: a tenth of ``hang_after``,
    at most PROGRESS_S (less half a tick: at the tick nearest it)."""
    if isinstance(hang_after, str):  # ("auto": 300 s and more)
        return PROGRESS_S - TICK_S / 2
    return min(PROGRESS_S, hang_after / PROGRESS_SHARE) - TICK_S / 2


class SidecarUnavailable(Exception):
    """The sidecar could not start: the session runs its worker in this process."""


class Feeder:
    def __init__(
        self,
        source: StepSource,
        efficiency: EfficiencyTracker,
        regions: RegionLog,
        settings: Settings,
        version: str,
        offset_ns: int,
        metrics_socket: Any | None,
        record: Any = None,
        relay: tuple[Any, Any, Any] | None = None,
    ) -> None:
        """``record``: the run record's plan (export/record.py), or None; ``relay``: the
        application's (tracer, meter, logger) providers, which the sidecar serves through
        the relay (relay.py), or None when it exports itself."""
        self.source = source
        self.efficiency = efficiency
        self.regions = regions
        self._lock = threading.Lock()  # one pump at a time; a second caller skips
        self.dropped_steps = 0
        self._facts: Any = None
        self._hint: str | None = None  # the precision hint the facts were made with
        self.steps_sent = 0
        self._pumps = 0
        self._flush_seq = 0
        self.stats: dict[str, Any] = {}  # the sidecar's figures at the last flush
        self.memory = own_memory()  # this process's, sent with each delivery
        self.relay: RelayIn | None = None
        self.ring = Ring(source.recorder)  # (its memory is the sidecar's to read too)
        self.process = self._start(metrics_socket, relay, offset_ns, version)
        self.handover = RawHandover(
            source.recorder, self.process.send, self.ring, self.process.gone
        )
        self.process.send((wire.HELLO, settings, version, offset_ns, os.getpid(), record))
        answer = self.process.wait_for(
            (wire.READY, wire.FAILED), time.monotonic() + START_TIMEOUT_S
        )
        if answer is None or answer[0] == wire.FAILED:
            self.process.kill()
            self.ring.close()
            if answer is not None and answer[1] == "config":
                raise ConfigError(answer[2])
            why = answer[2] if answer else f"no answer (exit code {self.process.proc.poll()})"
            raise SidecarUnavailable(why)
        source.recorder.handover = self.handover
        # The hang watch's view of this process (the watch runs in the sidecar): None
        # when hang_after is off; a probe the sidecar asked for, until answered.
        self.hangs: LocalHangs | None = None
        if settings.hang_after != "off":
            directory = record.directory if record is not None else settings.debug_dir
            self.hangs = LocalHangs(source.recorder, regions, directory, hang_label())
        self._probe: tuple[float, float] | None = None
        self._told: tuple[Any, ...] = ()  # the progress last told
        self._tell_s = _tell_within(settings.hang_after)
        self.console = ConsoleHandback(settings.console, self.process.send)
        self._prints = prints_console(settings, rank())  # (this rank prints the summary)
        self.console.sync()
        self._last_pump = time.monotonic()
        self._stop = threading.Event()
        threading.Thread(target=self._tick, name="otel-train-feeder", daemon=True).start()

    def _start(
        self, metrics_socket: Any | None, relay: Any, offset_ns: int, version: str
    ) -> SidecarProcess:
        """The sidecar's process, handed the metrics socket, the relay's pipe (the
        application's providers, when there are: relay.py) and the ring's memory."""
        relay_w = None
        if relay is not None:
            relay_r, relay_w = os.pipe()
            self.relay = RelayIn(relay_r, relay, rank(), offset_ns, version)
        try:
            ring = (self.ring.fd, self.ring.capacity)
            return SidecarProcess(metrics_socket, relay_w, ring)
        except BaseException:
            self.ring.close()
            raise
        finally:
            if relay_w is not None:
                os.close(relay_w)  # (the sidecar holds it now)

    @property
    def proc(self) -> Any:
        return self.process.proc

    @property
    def dead(self) -> bool:
        return self.process.dead

    def _tick(self) -> None:
        """Pump when the training thread has not for a while (it paused, or it ended);
        tell the hang watch the progress (``_hang_messages``), and send the details it asks
        for (this thread runs while the training thread is stuck in a call that released
        the GIL)."""
        told = read = 0.0
        ticks = 0
        while not self._stop.wait(TICK_S):
            if self.dead:
                continue
            now = time.monotonic()
            ticks += 1
            if now - read >= MEMORY_S:
                read = now
                self.memory = own_memory()
            rec = self.source.recorder
            rec.watch_cuda()  # (CUDA showed up: the device is bound, then stamps)
            handover = self.handover
            if handover.raw and handover.shared:
                # The sidecar reads how far the ring is written off its header: only side
                # entries and new codes are told here, and its requests read now and then
                # (every GIL-holding tick is one the training thread may wait for).
                if handover.has_news() or ticks % CONTROL_TICKS == 0:
                    self.pump(idle=True)
            elif now - self._last_pump >= IDLE_PUMP_S or handover.raw:
                # (a raw session told by messages, a stamped one's events resolved here:
                # every tick)
                self.pump(idle=True)
            if self.hangs is not None and self._hang_messages(now - told):
                told = now

    # -- training thread ---------------------------------------------------------------

    def pump(self, idle: bool = False) -> None:
        """Hand every finished step to the sidecar (never waits)."""
        if not self._lock.acquire(blocking=False):
            return  # another thread pumps now: what finished goes with its delivery or the next
        try:
            self._last_pump = time.monotonic()
            self._pump(idle=idle)
            if idle:  # (the feeder's thread: the training thread is idle)
                self._read_control()
        except Exception:
            self.process.dead = True
            self.source.disable()
            _log.exception("otel-train: handing steps to the sidecar failed; recording disabled")
        finally:
            self._lock.release()

    def _pump(self, final: bool = False, idle: bool = False) -> None:
        """``idle``: on the feeder's thread (the training thread's pumps come from its
        hooks); ``final``: hand on everything, a partial step included."""
        pumps = self._pumps = self._pumps + 1
        if pumps % CONTROL_EVERY == 0:
            self._read_control()
        write = idle or final or pumps % WRITE_EVERY == WRITE_PHASE
        # A full pipe ends a raw session: what the ring holds cannot be dropped slot by
        # slot (the sidecar's replica would miss them), finished steps can (counted).
        if self.handover.raw and not final and not self._full():
            self._pump_raw(pumps % EXTRAS_EVERY == EXTRAS_PHASE)
        else:
            if self.handover.catching_up:  # (another thread replays the ring: its end)
                with self.source.recorder.lock:
                    pass
            delivery = self.source.take(derive=False, keep_partial=not final)
            # A session starts on the thread that logs (this pump came from its hook):
            # no call of that thread is halfway through logging the old way.
            if not final and not idle and not self._full():
                with self.source.recorder.lock:
                    self.handover.try_enter()
            self._send_delivery(delivery)
        if write or self.process.queued >= WRITE_AT:
            self.process.write()

    def _pump_raw(self, extras: bool) -> None:
        """A raw session's pump: what the sidecar was not told of the ring (raw.py)."""
        with self.source.recorder.lock:
            told = self.handover.take()
        if told is not None:
            self.process.send((wire.RING, *told))
        if extras:  # counters, regions, FLOP counts
            rec = self.source.recorder
            mem = rec.memory
            counters = Counters(
                dropped_steps=rec.dropped_steps,
                dropped_phases=rec.dropped_phases,
                dropped_scalars=rec.dropped_scalars,
                memory_total=mem.total_bytes if mem is not None else None,
                device_id=mem.device_id if mem is not None else None,
                notes=self.source.notes.lines,
            )
            self._send_delivery(Delivery(counters=counters))

    def _full(self) -> bool:
        return self.dead or self.process.queued > MAX_BUFFER

    def _send_delivery(self, delivery: Delivery) -> None:
        regions = self.regions.done
        taken_regions = [regions.popleft() for _ in range(len(regions))]
        probe = self.efficiency.probe
        counts: list[Any] = []
        probe_state = None
        if probe is not None:
            while probe.results:
                counts.append(probe.results.popleft())
            probe_state = (probe.armed, probe.failed)
        n = delivery.step_count()
        if self._full():
            self.dropped_steps += n
            return
        counters = wire.encode_counters(delivery.counters, self.dropped_steps, self.memory)
        self.process.send((wire.DELIVERY, delivery.parts, delivery.scalars, counters, taken_regions,
                           counts, probe_state, self._facts_if_new()))  # fmt: skip
        self.steps_sent += n

    def _facts_if_new(self) -> Any:
        rec = self.source.recorder
        cuda = rec.memory is not None or rec.device_timed
        hint = rec.precision_hint  # (an adapter may see autocast after the first step)
        known = self._facts
        if (
            known is not None
            and (known.device is not None or not cuda)
            and hint == self._hint
            and known.compiled == self.efficiency.runs_compiled()
        ):
            return None  # known (and CUDA, whose device name is a fact, is not in use yet)
        self._hint = hint
        facts = self.efficiency.facts()
        if facts == self._facts:
            return None
        self._facts = facts
        return facts

    def trace_first_from(self, index: int) -> None:
        """An instrumentation began: its first step (from ``index``) becomes a trace."""
        if not self.dead:
            self.process.send((wire.FIRST, index))

    def note_model(self) -> None:
        """A model was added: its facts go with the next delivery."""
        self._facts = None

    def _read_control(self) -> None:
        self.console.sync()
        for message in self.process.read():
            self._apply(message)

    def _hang_messages(self, since: float) -> bool:
        """PROGRESS every PROGRESS_S, or sooner when it changed (``since``: seconds since
        the last message), and the details of a HANG_PROBE asked for (on this thread: the
        training thread may have read the probe, but it never collects them). True if a
        message went."""
        hangs = self.hangs
        assert hangs is not None
        if self._probe is None and since < self._tell_s:
            return False
        progress = tuple(hangs.progress())
        probe, self._probe = self._probe, None
        if probe is None and progress == self._told and since < PROGRESS_S:
            return False
        message: tuple[Any, ...] = (wire.PROGRESS, progress)
        if probe is not None:
            message = (wire.HANG_DETAILS, hangs.collect(*probe), progress)
        if not self._lock.acquire(blocking=False):
            self._probe = probe  # (a pump now: next tick)
            return False
        try:
            self.process.send(message)
            self.process.write()
        finally:
            self._lock.release()
        self._told = progress
        return True

    def _apply(self, message: tuple[Any, ...]) -> None:
        if message[0] == wire.HANG_PROBE:
            self._probe = (message[1], message[2])
        elif message[0] == wire.ARM and self.efficiency.probe is not None:
            self.efficiency.probe.arm(message[1])
        elif message[0] == wire.IDLE:
            with self.source.recorder.lock:
                self.handover.on_idle(*message[1:])
        elif message[0] == wire.CONSOLE:
            self.console.write(message[1])

    def forget(self) -> None:
        """In a forked child: drop the parent's pipe ends without touching the sidecar,
        and stop writing to the ring (its memory is the parent's too)."""
        self._stop.set()
        self.process.forget()
        self.handover.detach()

    # -- flush and shutdown (bounded) ----------------------------------------------------

    def flush(self, timeout_s: float) -> bool:
        """Every step finished so far in the sidecar's metrics and exports; bounded."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self.console.sync()
            self.memory = own_memory()
            self._pump(final=True)
            self._flush_seq += 1
            seq = self._flush_seq
            self.process.send((wire.FLUSH, seq, max(0.0, timeout_s - 0.1)))
            kinds = (wire.FLUSHED, wire.ARM, wire.IDLE, wire.CONSOLE)
            while True:
                answer = self.process.wait_for(kinds, deadline)
                if answer is None:
                    return False
                if answer[0] != wire.FLUSHED:
                    self._apply(answer)
                elif answer[1] == seq:
                    self.stats = answer[2]
                    ok = bool(answer[3])
                    if self.relay is not None:  # (what it sent back: into the providers)
                        ok = self.relay.flush(deadline) and ok
                    return ok

    def close(self, deadline: float, drain_until: float) -> bool:
        """Hand on what resolves before ``drain_until``, then end the sidecar by
        ``deadline`` (monotonic seconds; killed past it). True if it ended in time."""
        self._stop.set()
        # What the sidecar has not applied by then it counts as dropped: a backlog read
        # whole would keep it past the deadline (then killed: no summary, no count).
        publish_drain_by(self.ring.view, int(drain_until * 1e9))
        with self._lock:
            self.memory = own_memory()
            self.process.gone()  # (then what is left is dropped and counted, not queued)
            while True:
                self._pump(final=True)
                if not self.source.has_work() or time.monotonic() >= drain_until or self.dead:
                    break
                time.sleep(0.005)
            self.console.sync()  # (where the summary goes)
            if self.hangs is not None:  # (the last word: a stall that just ended resolves)
                self.process.send((wire.PROGRESS, tuple(self.hangs.progress())))
            self.process.send((wire.END, max(0.0, deadline - time.monotonic())))
            in_time = self.process.end(deadline)
            for message in self.process.last_messages:
                if message[0] == wire.CONSOLE:
                    self.console.write(message[1])
            if self.relay is not None:  # (what it sent back before it ended)
                self.relay.drain(deadline)
                self.relay.close()
                if self.relay.dropped and self._prints:  # (after the sidecar's summary)
                    self.console.write(self.relay.dropped_line())
                # (spans dropped on this side, or the application's SDK failed: False)
                in_time = in_time and not self.relay.dropped and not self.relay.failed
            with self.source.recorder.lock:
                self.handover.leave_raw()  # (left at the final pump already, as a rule)
                self.ring.close()
            return in_time
