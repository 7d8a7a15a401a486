"""Flush telemetry when the process is told to stop.

SIGTERM (what ``torchrun``, SLURM and Kubernetes send before SIGKILL) ends a Python
process without running ``atexit``, so whatever telemetry is buffered would be lost.
``SigtermFlush`` installs a handler on the main thread when the session starts:

- no handler of yours (``SIG_DFL``): shut down within ``shutdown_timeout`` (drain,
  flush), restore the default action and re-raise SIGTERM, so the process still dies
  by SIGTERM with the same exit status;
- your own handler installed before: it is called as before, and nothing else is
  done here (``sys.exit()`` from it runs the ``atexit`` flush);
- SIGTERM ignored (``SIG_IGN``), or not on the main thread: nothing is installed.

SIGINT needs nothing: Python raises ``KeyboardInterrupt`` and ``atexit`` flushes.
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
from collections.abc import Callable
from types import FrameType
from typing import Any

_log = logging.getLogger("otel_train")


class SigtermFlush:
    def __init__(self, flush: Callable[[], object]) -> None:
        self._flush = flush
        self._previous: Any = None
        self._installed = False

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            previous = signal.getsignal(signal.SIGTERM)
            if previous is signal.SIG_IGN or previous is None:
                return False  # ignored, or set from outside Python: leave it alone
            signal.signal(signal.SIGTERM, self._handle)
        except (ValueError, OSError):
            return False
        self._previous = previous
        self._installed = True
        return True

    def uninstall(self) -> None:
        if not self._installed:
            return
        self._installed = False
        try:
            if signal.getsignal(signal.SIGTERM) == self._handle:
                signal.signal(signal.SIGTERM, self._previous)
        except (ValueError, OSError):
            pass  # not on the main thread: the handler stays, and calls the previous one

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
            return
        try:
            self._flush()
        except Exception:
            _log.exception("otel-train: flushing telemetry on SIGTERM failed")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
