"""The sidecar process (otel_train/sidecar/): what otel-train configures itself runs
beside the training process, and training never depends on it.

Each test trains a real loop in this process with its own SDK (no providers passed),
so a real ``python -m otel_train.sidecar`` serves /metrics; figures are read back by
scraping it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from otel_helpers import tiny_loader, tiny_model, train_epoch
from prometheus_client.parser import text_string_to_metric_families
from scratch import job_env

import otel_train
from otel_train import contract as c
from otel_train import session as session_mod
from otel_train.handover import feeder as feeder_mod
from otel_train.recording.layouts import ENTER, EXIT


def scrape(address: tuple[str, int]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    host, port = address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k.startswith("phase")))
            out[(s.name, labels)] = s.value
    return out


def steps_total(address: tuple[str, int], want: int, timeout_s: float = 15.0) -> float:
    """``otel_train_steps_total`` once it reaches ``want`` (or the last value seen)."""
    name = c.prometheus_names(c.STEPS, source="scrape")[0]
    deadline = time.monotonic() + timeout_s
    value = -1.0
    while time.monotonic() < deadline:
        value = scrape(address).get((name, ()), -1.0)
        if value >= want:
            return value
        time.sleep(0.1)
    return value


@pytest.fixture
def own_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ):
        monkeypatch.delenv(var, raising=False)
    yield
    otel_train.shutdown()


def _counted_once(sess: Any, trained: int) -> None:
    """The sidecar's /metrics counts every trained step once, and each of its phases."""
    address = sess.prometheus_address
    assert steps_total(address, trained) == trained
    figures = scrape(address)
    count = c.prometheus_names(c.PHASE_DURATION, source="scrape")[2]
    for phase in ("data", "forward", "backward", "optimizer"):
        assert figures[(count, (("phase", phase),))] == trained, phase


def _started(**settings: Any) -> tuple[Any, Any, Any, Any]:
    model, opt = tiny_model()
    loader = tiny_loader(n=64, batch_size=8)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, prometheus_port=0, console="off", **settings
    )
    sess = session_mod.current()
    assert sess is not None and sess.feeder is not None, "own SDK: a sidecar serves it"
    return sess, model, opt, loader


def _epochs_until_raw(sess: Any, model: Any, opt: Any, loader: Any, **kw: Any) -> int:
    """Epochs of the plain loop until a raw session opens (the FLOP count's steps run
    applied here first); asserts that it opened."""
    epochs, deadline = 0, time.monotonic() + 10
    while not sess.feeder.handover.raw and time.monotonic() < deadline:
        train_epoch(model, opt, loader, **kw)
        epochs += 1
    assert sess.feeder.handover.raw, "a plain loop's log went out raw"
    return epochs


def test_steps_sent_raw_and_caught_up_count_once(own_sdk: None) -> None:
    """A plain loop's log goes out unapplied (raw); asking for the open step mid-run makes
    the recorder catch up here. Every step is counted once, with every phase."""
    sess, model, opt, loader = _started()
    epochs = 4
    for _ in range(epochs):
        train_epoch(model, opt, loader)
    handover = sess.feeder.handover
    epochs += _epochs_until_raw(sess, model, opt, loader)
    time.sleep(0.3)  # the sidecar reports an idle point: what was sent before it is let go
    train_epoch(model, opt, loader)
    assert sess.recorder.current_step is None  # between steps, once caught up
    assert handover.left >= 1 and not handover.raw and handover.caught_up > 0
    assert sess.recorder._next_index == (epochs + 1) * len(loader)
    for _ in range(3):
        train_epoch(model, opt, loader)
    trained = (epochs + 4) * len(loader)
    _counted_once(sess, trained)


def test_a_fast_loop_run_raw_for_seconds_loses_no_step(own_sdk: None) -> None:
    """A loop of thousands of steps a second, in a raw session for seconds with no
    flush: the sidecar reads the ring as it fills and the worker takes what it read before
    the backlog's bound, so every step is counted, none dropped. (The worker took only
    every half second while the ring's reads held ~500 steps every tenth of one: a 5,000
    steps/s loop lost half its steps to the bound.)"""
    sess, model, opt, loader = _started()
    trained = _epochs_until_raw(sess, model, opt, loader) * len(loader)
    t = time.monotonic()
    while time.monotonic() - t < 2.0:  # (no flush, no state asked for: raw throughout)
        train_epoch(model, opt, loader)
        trained += len(loader)
    assert otel_train.flush(30)
    stats = sess.feeder.stats
    figures = scrape(sess.prometheus_address)
    dropped = c.prometheus_names(c.DROPPED, source="scrape")[0]
    lost = {k: v for k, v in figures.items() if k[0] == dropped and v}
    assert (stats["steps"], lost) == (trained, {})
    _counted_once(sess, trained)


def test_a_loop_that_flushes_every_thousand_steps_stays_raw_between_flushes(
    own_sdk: None,
) -> None:
    """A flush ends the raw session (the state is brought here); the next one begins
    after a wait that doubles only while sessions end soon after they begin. (It doubled
    at every end: from the seventh flush on, most of each thousand steps were logged the
    old way, and the waits grew to thousands of pumps.)"""
    sess, model, opt, loader = _started()
    handover = sess.feeder.handover
    raw_slots = []
    for _ in range(10):
        written = handover.ring.writer.pos
        for _ in range(1000 // len(loader)):
            train_epoch(model, opt, loader)
        raw_slots.append(handover.ring.writer.pos - written)
        assert otel_train.flush(30)
    assert handover.left >= 9
    assert min(raw_slots[1:]) >= raw_slots[1] // 2 > 0, raw_slots


def test_a_catch_up_right_after_an_idle_report_replays_only_what_followed_it(
    own_sdk: None,
) -> None:
    """Slots the sidecar acknowledged are let go (raw.py); a catch-up right after an
    idle report replays only what followed the idle point (nothing, here), so no step
    or phase counts twice."""
    sess, model, opt, loader = _started()
    handover = sess.feeder.handover
    epochs = _epochs_until_raw(sess, model, opt, loader)
    for _ in range(6):  # about 600 slots written raw
        train_epoch(model, opt, loader)
        epochs += 1
    time.sleep(1.0)  # idle: the feeder's own pumps read the sidecar's idle reports
    # The case under test: everything written was acknowledged.
    assert handover.acked() == handover.ring.writer.pos > 0
    assert sess.recorder.current_step is None  # the state asked for right after
    assert handover.caught_up == 0  # (nothing followed the idle point)
    assert handover.left >= 1 and not handover.raw
    assert sess.recorder._next_index == epochs * len(loader)
    for _ in range(2):
        train_epoch(model, opt, loader)
    trained = (epochs + 2) * len(loader)
    _counted_once(sess, trained)


def test_importing_the_package_or_the_sidecar_imports_no_torch() -> None:
    """``import otel_train`` imports nothing more (the API loads at its first use), and
    the sidecar's modules import no torch: ``python -m otel_train.sidecar`` imports the
    package first, then its agent."""
    import subprocess
    import sys

    probe = (
        "import sys, otel_train\n"
        "assert 'torch' not in sys.modules and 'otel_train.session' not in sys.modules\n"
        "import otel_train.sidecar.agent\n"
        "assert 'torch' not in sys.modules, 'the sidecar imports torch'\n"
        "otel_train.instrument\n"
        "assert 'otel_train.session' in sys.modules and 'torch' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_sidecar_imports_no_torch_and_stays_small(own_sdk: None) -> None:
    """The sidecar imports only what it uses (issue 24: with torch it was a second
    process of a training job's size, ~600 MiB resident). What crosses the pipe is read
    there without torch too: the settings, applied steps with a FLOP count, the log's
    entries sent raw, scalars, a region. Its own report after a flush: torch is not
    among its modules, and it stays under 120 MiB resident (measured here: ~34 MiB)."""
    sess, model, opt, loader = _started(hang_after=60.0)
    with otel_train.region("evaluation"):
        train_epoch(model, opt, loader, record=True)  # (its steps: the region's time)
    _epochs_until_raw(sess, model, opt, loader, record=True)
    for _ in range(3):
        train_epoch(model, opt, loader, record=True)
    assert sess.efficiency.probe is not None and sess.efficiency.probe.counted_steps >= 1
    assert otel_train.flush(10.0)
    stats = sess.feeder.stats
    assert stats["steps"] > 0
    assert stats["torch_imported"] is False, "the sidecar imported torch"
    assert 0 < stats["rss_bytes"] < 120 * 2**20, f"{stats['rss_bytes'] / 2**20:.0f} MiB"


def test_an_answer_read_together_with_another_is_kept(own_sdk: None) -> None:
    """Two answers the sidecar wrote before the training process read: one read takes
    both, and the second is there for the next wait (a FLUSHED behind an IDLE was lost
    this way, and flush() waited its whole deadline)."""
    from otel_train.handover import wire
    from otel_train.handover.process import SidecarProcess
    from otel_train.settings import Settings

    settings = Settings.resolve({"prometheus": False, "console": "off", "run_dir": "off"})
    proc = SidecarProcess(None)
    try:
        proc.send((wire.HELLO, settings, "test", 0, os.getpid(), None))
        assert proc.wait_for((wire.READY,), time.monotonic() + 30) == (wire.READY,)
        proc.send((wire.FLUSH, 1, 5.0))
        proc.send((wire.FLUSH, 2, 5.0))
        proc.write()
        time.sleep(1.0)  # both answered: one read takes the two frames
        first = proc.wait_for((wire.FLUSHED,), time.monotonic() + 5)
        second = proc.wait_for((wire.FLUSHED,), time.monotonic() + 5)
        assert first is not None and first[1] == 1
        assert second is not None and second[1] == 2, "the second answer was lost"
    finally:
        proc.kill()


def test_training_goes_on_when_the_sidecar_dies(
    own_sdk: None, caplog: pytest.LogCaptureFixture
) -> None:
    sess, model, opt, loader = _started(shutdown_timeout=2.0)
    train_epoch(model, opt, loader)
    sess.feeder.proc.kill()
    sess.feeder.proc.wait()
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for _ in range(20):
            train_epoch(model, opt, loader)  # never raises, never blocks
        assert sess.recorder.enabled
        started = time.monotonic()
        otel_train.shutdown()
        assert time.monotonic() - started < 2.5
    exited = [r for r in caplog.records if "sidecar process exited" in r.getMessage()]
    assert len(exited) == 1
    feeder = sess.feeder
    assert feeder.dead and feeder.dropped_steps > 0  # (a full pipe ends raw sessions)


def test_shutdown_keeps_its_deadline_with_the_sidecar_stopped(own_sdk: None) -> None:
    sess, model, opt, loader = _started(shutdown_timeout=1.0)
    train_epoch(model, opt, loader)
    os.kill(sess.feeder.proc.pid, signal.SIGSTOP)
    try:
        for _ in range(5):
            train_epoch(model, opt, loader)
        started = time.monotonic()
        assert otel_train.shutdown() is False  # not in time: the sidecar was killed
        assert time.monotonic() - started < 1.5
        assert sess.feeder.proc.returncode is not None
    finally:
        if sess.feeder.proc.poll() is None:
            os.kill(sess.feeder.proc.pid, signal.SIGKILL)


def test_sidecar_off_keeps_the_work_on_a_thread(own_sdk: None) -> None:
    model, opt = tiny_model()
    otel_train.instrument(model, optimizer=opt, prometheus_port=0, console="off", sidecar="off")
    sess = session_mod.current()
    assert sess is not None and sess.feeder is None and sess.worker is not None


def test_console_stdout_reaches_the_training_process_stdout(tmp_path: Any) -> None:
    """The sidecar's own stdout is its pipe to the trainer: console="stdout" tables go to
    the training process's stdout instead, and the pipe stays whole."""
    import subprocess
    import sys
    import textwrap

    job = textwrap.dedent("""
        import torch, otel_train
        model = torch.nn.Linear(8, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ds = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 2))
        loader = torch.utils.data.DataLoader(ds, batch_size=8)
        otel_train.instrument(model, optimizer=opt, dataloader=loader, prometheus=False,
                              console="stdout", console_every=4, run_dir="off")
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
        assert otel_train.shutdown()
        print("trained")
    """)
    env = job_env()
    done = subprocess.run([sys.executable, "-c", job], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "otel-train run summary: 8 steps" in done.stdout
    assert done.stdout.count("otel-train steps ") >= 2 or "steps 0-3" in done.stdout
    assert "broken stream" not in done.stderr and "sidecar" not in done.stderr.lower()
    assert done.stdout.rstrip().endswith("trained")


def test_the_sidecar_imports_nothing_from_the_jobs_working_directory(tmp_path: Any) -> None:
    """A ``json.py`` in the directory the job runs in is not imported by the sidecar
    (which would run it in place of the standard library's): only otel-train's code runs
    there. The job's script lives elsewhere, so the job itself does not import it either."""
    import subprocess
    import sys
    import textwrap

    work, scripts = tmp_path / "work", tmp_path / "scripts"
    work.mkdir()
    scripts.mkdir()
    (work / "json.py").write_text(
        "import os\n"
        "open(os.path.join(os.path.dirname(os.path.abspath(__file__)),\n"
        "                  f'imported-by-{os.getpid()}'), 'w').close()\n"
        "raise ImportError('the planted json.py')\n"
    )
    (scripts / "job.py").write_text(
        textwrap.dedent("""
        import torch, otel_train
        model = torch.nn.Linear(8, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ds = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 2))
        loader = torch.utils.data.DataLoader(ds, batch_size=8)
        otel_train.instrument(model, optimizer=opt, dataloader=loader, prometheus=False,
                              console="stdout", run_dir="off")
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
        assert otel_train.shutdown()
        """)
    )
    done = subprocess.run([sys.executable, str(scripts / "job.py")], env=job_env(),
                          capture_output=True, text=True, timeout=120, cwd=work)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert not list(work.glob("imported-by-*")), done.stderr[-2000:]
    assert "otel-train run summary: 4 steps" in done.stdout, done.stderr[-2000:]


def test_the_sidecars_backlog_of_received_steps_is_bounded_and_its_drops_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sidecar yields its core to training: a worker that falls behind must not hold
    whatever the pipe brings. Past the bound the oldest steps go, counted as the
    feeder's are (dropped{reason="sidecar"})."""
    from otel_train.processing.resolved import finished_step
    from otel_train.processing.source import Counters, Delivery
    from otel_train.settings import Settings
    from otel_train.sidecar import replica

    monkeypatch.setattr(replica, "MAX_HELD_STEPS", 100)
    source = replica.RemoteSource(Settings(), lambda message: None)
    index = 0
    for _ in range(50):  # 50 batches of 10 steps arrive before the worker takes any
        steps = [finished_step(index + i, 0, 1) for i in range(10)]
        index += 10
        source.push(Delivery(parts=[steps], counters=Counters(dropped_handover=3)))
    batch = source.take()
    kept = [part.step(i).index for part in batch.parts for i in range(part.k)]
    assert kept == list(range(400, 500))  # the newest 100
    assert batch.counters.dropped_handover == 3 + 400  # the feeder's and the backlog's


def test_an_entry_logged_the_old_way_as_a_raw_session_opens_reaches_the_sidecar(
    own_sdk: None,
) -> None:
    """Another thread's call that read "no ring" just before a raw session opened appends
    its entries to the log after the session took it: they go into the ring at the next
    pump, so the sidecar applies them, and the session goes on. (They were applied here
    only, at a catch-up that ended the session, and a step the sidecar had finished
    without them lost them.)"""
    sess, model, opt, loader = _started()
    handover, rec = sess.feeder.handover, sess.recorder
    _epochs_until_raw(sess, model, opt, loader)
    left = handover.left

    def stray() -> None:  # what the race leaves: this thread's phase in the old log
        stack, t = rec._tls_stack(), time.perf_counter_ns()
        rec._log.extend([(stack, t, ENTER, "stray"), (stack, t + 1000, EXIT, "stray", None)])

    thread = threading.Thread(target=stray)
    thread.start()
    thread.join()
    time.sleep(4 * feeder_mod.TICK_S * feeder_mod.CONTROL_TICKS)  # (the feeder's pumps)
    for _ in range(3):
        train_epoch(model, opt, loader)
    assert handover.raw and handover.left == left  # the session went on
    assert otel_train.flush(30)
    count = c.prometheus_names(c.PHASE_DURATION, source="scrape")[2]
    assert scrape(sess.prometheus_address).get((count, (("phase", "stray"),))) == 1
