"""The run record's directory: its owner's, made at the record's first write (a process
that writes nothing leaves no directory behind).

Mode DIRECTORY_MODE (0700; a stricter umask takes more away), so that on a ``run_dir``
other users can write to, none of them can read the record or put a file in it. It is
created exclusively: a process of its own (no run id, no launcher) takes ``<name>-2``,
``-3``, ... when its name is taken (and says where it went); the processes of one run
(ranks under a launcher, a run id) share it, and a process takes an existing one only
when it is a directory of this user that no one else can write to.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from pathlib import Path

_log = logging.getLogger("otel_train")

DIRECTORY_MODE = 0o700
MAX_NUMBERED = 99  # <name>-2 ... <name>-99 tried after <name>


def numbered(path: str, n: int) -> str:
    return path if n == 1 else f"{path}-{n}"


def free_name(path: str) -> str:
    """``path`` or the first numbered name beside it that nothing has now (a plan: the
    directory itself is made exclusively at the first write)."""
    return next(
        (numbered(path, n) for n in range(1, MAX_NUMBERED + 1)
         if not os.path.lexists(numbered(path, n))),
        path,
    )  # fmt: skip


def make_run_directory(path: str, shared: bool) -> str:
    """The directory ``path``, created exclusively with DIRECTORY_MODE (its parent as
    any directory). ``shared``: an existing one is taken when it is this user's own
    that no one else can write to; else a taken name gets ``-2``, ``-3``, ... OSError
    says why none could be had."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for n in range(1, MAX_NUMBERED + 1):
        candidate = numbered(path, n)
        try:
            os.mkdir(candidate, DIRECTORY_MODE)
            return candidate
        except FileExistsError:
            if not shared:
                continue
            problem = not_own_directory(candidate)
            if problem:
                raise OSError(f"{candidate} exists and {problem}") from None
            return candidate
    raise OSError(f"{path} and its next {MAX_NUMBERED - 1} numbered names are taken")


def not_own_directory(path: str) -> str:
    """Why ``path`` is no directory of this user's that only they can write to ('': it is)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"others can write to it (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


class RunDirectory:
    """The directory one process's record files share, made once by the first of them
    to write (thread-safe); an OSError is raised again at each write until it is made."""

    def __init__(self, planned: str, shared: bool) -> None:
        self.planned = planned
        self.shared = shared
        self._made: Path | None = None
        self._lock = threading.Lock()

    def path(self) -> Path:
        with self._lock:
            if self._made is None:
                made = make_run_directory(self.planned, self.shared)
                if made != self.planned:
                    _log.warning(
                        "otel-train: run record in %s (%s was taken meanwhile)", made, self.planned
                    )
                self._made = Path(made)
            return self._made
