"""One holder per state directory, by an OS lock.

A check-then-act ("is a controller's pid alive? then start one") lets two starters
through at once, and each then kills the other's workers as strays. An advisory lock
(``flock``) on a file of the state directory cannot: the kernel grants it to one
process and releases it when that process ends, however it ends (SIGKILL included),
so a crashed controller never leaves a stale lock behind.

Two locks: ``controller.lock``, held by the controller for its whole life, whatever
started it (``deepboot up`` or ``python -m deepboot.runtime.controller_process``); and
``up.lock``, held by ``deepboot up`` while it starts a cluster and its controller, so
that two ``up`` at once run one after the other (the second then finds the first's
cluster up). Each lock file holds its holder's pid, for the message of the one refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from deepboot.core.errors import DeepbootError


class HeldElsewhereError(DeepbootError):
    """The lock is held by another process (``pid``, or None when it wrote none)."""

    def __init__(self, path: Path, pid: int | None, what: str) -> None:
        self.path, self.pid = path, pid
        who = f"pid {pid}" if pid is not None else "another process"
        super().__init__(f"{what} already runs for {path.parent} ({who}; lock {path.name})")


class StateLock:
    """An exclusive ``flock`` on ``path``, released by :meth:`release` or by the
    process's end. Not reentrant; one object per holder.

    Args:
        path: The lock file (created if missing, mode 0600).
        what: Who holds it, in words, for the refusal's message ("a controller").
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path, self.what = path, what
        self._fd: int | None = None

    def acquire(self, wait_s: float = 0.0) -> StateLock:
        """Take the lock, waiting at most ``wait_s`` seconds; returns self.

        Raises:
            HeldElsewhereError: another process holds it (naming its pid).
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    pid = _holder(fd)
                    os.close(fd)
                    raise HeldElsewhereError(self.path, pid, self.what) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


@contextlib.contextmanager
def holding(path: Path, what: str, wait_s: float = 0.0) -> Iterator[StateLock]:
    """``with holding(path, what):`` the lock for the block's duration."""
    lock = StateLock(path, what).acquire(wait_s)
    try:
        yield lock
    finally:
        lock.release()


def _holder(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (ValueError, OSError):
        return None
