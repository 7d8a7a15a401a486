"""Flush telemetry when the process is told to stop, and never deadlock doing it.

SIGTERM (what ``torchrun``, SLURM and Kubernetes send before SIGKILL) ends a Python
process without running ``atexit``, so whatever telemetry is buffered would be lost.
``SigtermFlush`` installs a handler on the main thread when the session starts:

- no handler of yours (``SIG_DFL``): shut down within ``shutdown_timeout`` (drain,
  flush), restore the default action and re-raise SIGTERM, so the process still dies
  by SIGTERM with the same exit status;
- your own handler installed before: it is called as before, and nothing else is
  done here (``sys.exit()`` from it runs the ``atexit`` flush);
- SIGTERM ignored (``SIG_IGN``), or not on the main thread: nothing is installed.

SIGINT raises ``KeyboardInterrupt`` as Python's own handler does, and ``atexit``
flushes; a handler of yours is called as before.

A signal runs its handler on the main thread between two bytecodes, wherever that
thread is: also inside otel-train's own code (a hook, a pump to the sidecar), holding
a lock the flush needs or halfway through changing a structure the flush reads. There
the handler does nothing but ask again a moment later (a timer thread sends the same
signal), so the flush, the user's handler or the ``KeyboardInterrupt`` happens in the
user's code, a few microseconds on. A thread that stays inside otel-train past
``DEFER_LIMIT_S`` gets the signal's own action without the flush: a lost flush, never
a hung job.

A handler you install after otel-train replaces this one; call ``otel_train.shutdown()``
from it. SIGKILL cannot be caught: what is not yet exported is lost.

Usage::

    guard = SigtermFlush(lambda: session.shutdown())
    guard.install()
    ...
    guard.uninstall()
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

_log = logging.getLogger("otel_train")
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Frames of adapters/ call the user's code back (a wrapped forward, a callback): being
# under one is being in the user's code.
_CALLS_BACK = os.path.join(_PACKAGE, "adapters") + os.sep
RETRY_S = 0.001  # how soon a deferred signal is sent again
DEFER_LIMIT_S = 2.0  # inside otel-train for this long: the signal's own action, no flush


def inside_telemetry(frame: FrameType | None) -> bool:
    """Whether a thread stopped at ``frame`` is running otel-train's own code."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_PACKAGE) and not name.startswith(_CALLS_BACK):
            return True
        frame = frame.f_back
    return False


class SigtermFlush:
    def __init__(self, flush: Callable[[], object]) -> None:
        self._flush = flush
        self._previous: dict[int, Any] = {}
        self._deferred_since: dict[int, float] = {}
        self.deferrals = 0  # signals asked again because they came inside otel-train

    def install(self) -> bool:
        """True if the SIGTERM flush is installed (SIGINT's deferral goes with it)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if not self._take(signal.SIGTERM):
            return False
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._take(signal.SIGINT)
        return True

    def _take(self, signum: int) -> bool:
        try:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN or previous is None:
                return False  # ignored, or set from outside Python: leave it alone
            signal.signal(signum, self._handle)
        except (ValueError, OSError):
            return False
        self._previous[signum] = previous
        return True

    def uninstall(self) -> None:
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            try:
                if signal.getsignal(signum) == self._handle:
                    signal.signal(signum, handler)
            except (ValueError, OSError):
                pass  # not on the main thread: the handler stays, and calls the previous one

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        flush = True
        if inside_telemetry(frame):
            if self._defer(signum):
                return
            flush = False  # (stuck inside otel-train: the flush could wait on itself)
        self._deferred_since.pop(signum, None)
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)  # (SIGINT's default raises KeyboardInterrupt here)
            return
        if signum == signal.SIGTERM and flush:
            try:
                self._flush()
            except Exception:
                _log.exception("otel-train: flushing telemetry on SIGTERM failed")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _defer(self, signum: int) -> bool:
        """Ask again in RETRY_S; False once DEFER_LIMIT_S has passed."""
        now = time.monotonic()
        since = self._deferred_since.setdefault(signum, now)
        if now - since > DEFER_LIMIT_S:
            _log.warning(
                "otel-train: %s arrived while otel-train's code ran for over %.0f s: "
                "not flushing", signal.Signals(signum).name, DEFER_LIMIT_S,
            )  # fmt: skip
            return False
        self.deferrals += 1
        timer = threading.Timer(RETRY_S, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return True
