"""The sidecar as seen from the training process: a child process and its two pipes.

Writes never wait: frames go to an outbox (any thread may add one), and whoever holds
the feeder's lock moves them into a buffer and writes what the pipe takes with a
non-blocking ``write``. The pipe is widened to 1 MiB where Linux allows. A dead sidecar
(``EPIPE``) is reported once; what follows is dropped by the caller, which counts it.
Only :meth:`wait_for` and :meth:`end` wait, each bounded by its deadline.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import logging
import os
import select
import socket
import subprocess
import sys
import time
from typing import Any

from . import wire

_log = logging.getLogger("otel_train")
PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = 1031

# The sidecar runs otel-train's code and the libraries installed beside it, never a file
# of the job's working directory (a json.py there would be imported in place of the
# standard library's): -P leaves the working directory off its sys.path. Python 3.10 has
# no -P: there -c takes out the '' it puts first, then runs the module.
if sys.version_info >= (3, 11):
    SIDECAR_COMMAND = [sys.executable, "-P", "-m", "otel_train.sidecar"]
else:  # pragma: no cover (CI runs 3.11)
    SIDECAR_COMMAND = [
        sys.executable,
        "-c",
        "import sys; del sys.path[0]; import runpy; "
        "runpy.run_module('otel_train.sidecar', run_name='__main__', alter_sys=True)",
    ]


class SidecarProcess:
    def __init__(
        self,
        metrics_socket: socket.socket | None,
        relay_fd: int | None = None,
        ring: tuple[int, int] | None = None,
    ) -> None:
        """``relay_fd``: the write end of the relay's pipe (relay.py), handed to it;
        ``ring``: the shared-memory ring's descriptor and capacity (recording/ring.py)."""
        pass_fds: tuple[int, ...] = ()
        env = dict(os.environ)
        env.pop("OTEL_TRAIN_SIDECAR_RELAY_FD", None)
        env.pop("OTEL_TRAIN_SIDECAR_RING", None)
        if ring is not None:
            pass_fds += (ring[0],)
            env["OTEL_TRAIN_SIDECAR_RING"] = f"{ring[0]}:{ring[1]}"
        if relay_fd is not None:
            pass_fds += (relay_fd,)
            env["OTEL_TRAIN_SIDECAR_RELAY_FD"] = str(relay_fd)
        if metrics_socket is not None:
            pass_fds += (metrics_socket.fileno(),)
            env["OTEL_TRAIN_SIDECAR_METRICS_FD"] = str(metrics_socket.fileno())
        # Its stdout is the pipe back here: console="stdout" prints to this process's
        # stdout, handed over as a descriptor of its own.
        console_fd = _dup_stdout()
        if console_fd is not None:
            pass_fds += (console_fd,)
            env["OTEL_TRAIN_SIDECAR_STDOUT_FD"] = str(console_fd)
        try:
            self.proc = subprocess.Popen(
                SIDECAR_COMMAND,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=pass_fds,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the trainer only: it ends the sidecar
            )
        finally:
            if console_fd is not None:
                os.close(console_fd)
        if metrics_socket is not None:
            metrics_socket.close()  # the sidecar serves it now
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._w = self.proc.stdin.fileno()
        self._r = self.proc.stdout.fileno()
        for fd in (self._w, self._r):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        with contextlib.suppress(OSError):  # else the default 64 KiB: the buffer takes more
            fcntl.fcntl(self._w, _F_SETPIPE_SZ, PIPE_SIZE)
        self._out = bytearray()
        self._outbox: collections.deque[bytes] = collections.deque()
        self.queued = 0  # bytes in the outbox and the buffer
        self._control = wire.FrameReader()
        self._frames = wire.FrameWriter()
        self._unread: list[tuple[Any, ...]] = []  # read past by wait_for: the next read's
        self.dead = False
        self.last_messages: list[tuple[Any, ...]] = []  # what it said while it ended

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: tuple[Any, ...]) -> None:
        """Queue a frame (any thread; written by the next :meth:`write`)."""
        data = self._frames.frame(message)
        self._outbox.append(data)
        self.queued += len(data)

    def write(self) -> None:
        """Write what the pipe takes now (the feeder's lock held)."""
        out, outbox = self._out, self._outbox
        while outbox:
            out += outbox.popleft()
        while out and not self.dead:
            try:
                n = os.write(self._w, out)
            except BlockingIOError:
                return  # the pipe is full: the rest goes with a later write
            except OSError as err:
                if err.errno not in (errno.EPIPE, errno.EBADF):
                    raise
                self._died()
                return
            del out[:n]
            self.queued -= n

    def gone(self) -> bool:
        """Whether it died: known at a failed write, or asked here (a wait syscall)."""
        if not self.dead and self.proc.poll() is not None:
            self._died()
        return self.dead

    def _died(self) -> None:
        self.dead = True
        self._out.clear()
        self._outbox.clear()
        self.queued = 0
        _log.warning(
            "otel-train: the sidecar process exited (code %s); telemetry from here on is "
            "dropped and counted, training goes on",
            self.proc.poll(),
        )

    def read(self) -> list[tuple[Any, ...]]:
        """The sidecar's messages that arrived (never waits), those a :meth:`wait_for`
        read past first."""
        if self._unread:
            unread, self._unread = self._unread, []
            return unread + self.read()
        try:
            data = os.read(self._r, 65536)
        except (BlockingIOError, OSError):
            return []
        return self._control.feed(data) if data else []

    def wait_for(self, kinds: tuple[int, ...], deadline: float) -> tuple[Any, ...] | None:
        """The first message of one of ``kinds``, or None at the deadline or the end.
        Messages of other kinds before it are dropped (callers name every kind they act
        on); those read with it and after it are kept for the next read."""
        while not self.dead:
            self.write()
            messages = self.read()
            for i, message in enumerate(messages):
                if message[0] in kinds:
                    self._unread = messages[i + 1 :]
                    return message
            if self.proc.poll() is not None:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            select.select([self._r], [self._w] if self._out else [], [], min(left, 0.05))
        return None

    def wait_written(self, deadline: float) -> bool:
        while (self._out or self._outbox) and not self.dead:
            self.write()
            left = deadline - time.monotonic()
            if not self._out or left <= 0:
                break
            select.select([], [self._w], [], min(left, 0.05))
        return not self.dead and not self._out

    def end(self, deadline: float) -> bool:
        """Close its stdin and wait for it to exit by ``deadline`` (killed past it),
        reading what it says meanwhile into :attr:`last_messages` (its run summary)."""
        written = self.wait_written(deadline)
        self._close_pipes(stdout=False)
        self.last_messages += self.read()  # (what a wait read past, and what is there)
        try:
            self._read_to_end(deadline)
            try:
                code = self.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                _log.warning("otel-train: the sidecar did not finish by the shutdown deadline")
                return False
        finally:
            self._close_pipes(stdin=False)
        return written and code == 0

    def _read_to_end(self, deadline: float) -> None:
        """Its messages until it closes its end of the pipe (it exits), by ``deadline``
        (read as they come: a full pipe would hold it up)."""
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self._r], [], [], min(left, 0.05))[0]:
                if self.proc.poll() is not None:
                    return
                continue
            try:
                data = os.read(self._r, 65536)
            except BlockingIOError:
                continue
            except OSError:
                return
            if not data:
                return
            self.last_messages += self._control.feed(data)

    def kill(self) -> None:
        self.dead = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close_pipes()

    def forget(self) -> None:
        """In a forked child: drop the parent's pipe ends without touching the sidecar."""
        self.dead = True
        self._out.clear()
        self._outbox.clear()
        self._close_pipes()
        self.proc.returncode = 0  # (this child did not start it: never wait for it)

    def _close_pipes(self, stdin: bool = True, stdout: bool = True) -> None:
        for keep, pipe in ((stdin, self.proc.stdin), (stdout, self.proc.stdout)):
            if keep and pipe is not None:
                with contextlib.suppress(OSError):  # nothing is buffered in these files
                    pipe.close()


def _dup_stdout() -> int | None:
    """A copy of this process's stdout descriptor (None when there is none)."""
    try:
        return os.dup(1)
    except OSError:
        return None
