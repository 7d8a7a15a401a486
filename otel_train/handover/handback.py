"""The console through the training process's own stream object.

The sidecar prints the console tables and the run summary to the descriptor it inherited
(fd 2, or fd 1 for ``console="stdout"``). That is where a terminal shows them, but not
where a replaced ``sys.stderr``/``sys.stdout`` object looks: ``contextlib.
redirect_stderr``, pytest's ``capsys``, a logging handler, an IDE's console, a Jupyter
kernel's stream. While the training process's stream object is not its own descriptor
(``sys.__stderr__``/``sys.__stdout__``), the sidecar hands the text back
(``(CONSOLE, text)``, wire.py) and the feeder writes it to that object: one write, at a
pump (or on the feeder's thread when training is idle, or in ``flush()``/``shutdown()``).
Which way is checked at each read of the sidecar's messages and before a flush or the
end, so a stream replaced after ``instrument()`` gets what is printed from then on.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

from . import wire

_log = logging.getLogger("otel_train")


def _streams(console: str) -> tuple[TextIO | None, TextIO | None]:
    """(the stream object the console writes to now, this process's own one)."""
    if console == "stdout":
        return sys.stdout, sys.__stdout__
    return sys.stderr, sys.__stderr__


class ConsoleHandback:
    def __init__(self, console: str, send: Any) -> None:
        """``console``: the setting (off, stderr, stdout); ``send``: queues a frame."""
        self._console = console
        self._send = send
        self._forward: bool | None = None  # what the sidecar was told last
        self._failed = False

    def sync(self) -> None:
        """Tell the sidecar where the text goes now, if that changed (two lookups)."""
        if self._console == "off":
            return
        stream, own = _streams(self._console)
        forward = stream is not own
        if forward != self._forward:
            self._forward = forward
            self._send((wire.CONSOLE_TO, forward))

    def write(self, text: str) -> None:
        """Text the sidecar handed back, to the stream object it is meant for now."""
        stream = _streams(self._console)[0]
        if stream is None or self._failed:
            return
        try:
            stream.write(text + "\n")
            stream.flush()
        except Exception:  # (a closed StringIO, say): logged once, the rest goes on
            self._failed = True
            _log.exception("otel-train: printing the console text failed; it is off")
