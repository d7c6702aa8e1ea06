"""Bounded logs (issue 42): the controller's log rotates, and what the endpoint logs
about what its peers send is rate-limited.

The controller's log, ``STATE_DIR/logs/controller.log``, holds two streams:

- its Python logging (the loop, the router, aiohttp, asyncio, warnings), through
  :func:`configure`: a :class:`logging.handlers.RotatingFileHandler` that rolls the
  file over at :data:`LOG_BYTES` and keeps :data:`LOG_BACKUPS` old ones
  (``controller.log.1`` the newest);
- what the process writes to its file descriptors 1 and 2 (Ray's C++ core, a
  traceback at exit, a fatal signal's dump): ``deepboot up`` opens ``controller.log``
  as the child's stdout and stderr (:mod:`deepboot.runtime.cluster.updown`), and
  :func:`configure` points both descriptors at the handler's file, again after every
  rollover. The kernel writes them (no thread to die before a crash's last words are
  in the file); a watcher rolls the file over when they alone take it past its size,
  within :data:`RAW_CHECK_S`.

So the log takes at most ``(LOG_BACKUPS + 1) * LOG_BYTES`` on disk (50 MiB), the
current file passing its size only by one record or what the descriptors get in
:data:`RAW_CHECK_S`. :func:`tail` reads its end across a rollover
(``deepboot up`` shows it when the controller fails to start).

:class:`PeerLimiter` bounds what one peer makes the endpoint log: a line per peer per
interval, a few lines per interval in all; what it holds back is counted and said in
the next line it lets through.

:class:`SharedLog` bounds the same way a log that several processes append to (a
service's ``service-<name>.log``, a job's ``<job>.log``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import logging.handlers
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOG_BYTES = 10 * 2**20
"""The size at which a log rolls over (``controller.log``; :class:`SharedLog`'s)."""
LOG_BACKUPS = 4
"""Old files of a log kept (``controller.log.1`` .. ``.4``)."""
RAW_CHECK_S = 5.0
"""How often the file's size is checked for what descriptors 1 and 2 wrote."""
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Rotating(logging.handlers.RotatingFileHandler):
    """A rotating file handler that, with ``std_fds``, also points file descriptors 1
    and 2 at its current file (at once, and after each rollover)."""

    def __init__(self, path: Path, max_bytes: int, backups: int, std_fds: bool) -> None:
        super().__init__(path, mode="a", maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        self.std_fds, self.open_ = std_fds, True
        if std_fds:
            self._adopt()

    def _adopt(self) -> None:
        if self.stream is None:
            self.stream = self._open()
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                f.flush()
        fd = self.stream.fileno()
        os.dup2(fd, 1)
        os.dup2(fd, 2)

    def doRollover(self) -> None:  # noqa: N802 (logging's name)
        super().doRollover()
        if self.std_fds:
            self._adopt()

    def close(self) -> None:
        self.open_ = False
        super().close()

    def roll_if_over(self) -> None:
        """Roll over when the file (records and raw output together) is at its size."""
        self.acquire()
        try:
            if not self.open_ or self.stream is None or self.maxBytes <= 0:
                return
            if os.fstat(self.stream.fileno()).st_size >= self.maxBytes:
                self.doRollover()
        finally:
            self.release()


def configure(
    path: Path,
    max_bytes: int = LOG_BYTES,
    backups: int = LOG_BACKUPS,
    std_fds: bool = True,
    level: int = logging.INFO,
) -> logging.Handler:
    """The controller's logging: every record (INFO and up) to ``path``, rotated (see
    the module docstring); warnings through logging. With ``std_fds`` (the controller;
    never in a test process) descriptors 1 and 2 go to the same file, and a watcher
    thread rolls it over when they fill it. Returns the handler (a test removes it).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = _Rotating(path, max_bytes, backups, std_fds)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    if std_fds:
        threading.Thread(target=_watch, args=(handler,), name="log-size", daemon=True).start()
    return handler


def _watch(handler: _Rotating) -> None:
    while handler.open_:
        time.sleep(RAW_CHECK_S)
        with contextlib.suppress(Exception):  # a full disk: the next check tries again
            handler.roll_if_over()


def tail(path: Path, lines: int = 15, window: int = 64 * 2**10) -> str:
    """The last ``lines`` lines of the log at ``path`` (read from its last ``window``
    bytes), with the end of ``path.1`` before them when ``path`` is short (it has just
    rolled over); "" when there is none."""
    out: list[str] = []
    for p in (path, path.with_name(path.name + ".1")):
        try:
            with p.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - window))
                chunk = f.read()
        except OSError:
            continue
        got = chunk.decode("utf-8", "replace").splitlines()
        if size > window:
            got = got[1:]  # the first may be cut
        out = got + out
        if len(out) >= lines or size > window:
            break
    return "\n".join(out[-lines:])


class SharedLog(io.TextIOBase):
    """A text stream appending to a log that several processes write at once (a
    service's replicas, a job's workers), bounded as the controller's: at
    ``max_bytes`` the file rolls over to ``.1`` .. ``.<backups>``, under an OS lock
    (``<path>.lock``) so that two writers never both rotate it; each write first
    checks that ``path`` is still the file it holds (else another writer rotated it:
    it opens the new one). A write is at most one line late into a rotated file.

    For ``sys.stdout = sys.stderr = SharedLog(path)`` in such a process: a service
    replica's output (``deepboot.runtime.actors.replica_actor``). A job's workers
    (``deepboot.elastic.worker``, a layer below this one) still append without a bound.
    """

    def __init__(
        self,
        path: Path,
        max_bytes: int = LOG_BYTES,
        backups: int = LOG_BACKUPS,
    ) -> None:
        super().__init__()
        self.path, self.max_bytes, self.backups = Path(path), max_bytes, backups
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._mutex = threading.Lock()
        self._midline = False
        self._f = self._open()

    def _open(self) -> Any:
        return self.path.open("a", buffering=1, encoding="utf-8", errors="replace")

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return int(self._f.fileno())

    def write(self, text: str) -> int:
        # Line-buffered: a line goes out in one write (whole, between other writers'),
        # and the file is followed and rotated only between lines.
        with self._mutex:
            if not self._midline:
                self._follow()
            n = int(self._f.write(text))
            self._midline = not text.endswith("\n")
            if not self._midline and os.fstat(self._f.fileno()).st_size >= self.max_bytes > 0:
                self._rotate()
            return n

    def flush(self) -> None:
        with self._mutex:
            self._f.flush()

    def close(self) -> None:
        if self.closed:
            return
        super().close()  # flushes
        with self._mutex:
            self._f.close()

    def _follow(self) -> None:
        """Open ``path`` again if another writer rotated it."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is None or st.st_ino != os.fstat(self._f.fileno()).st_ino:
            self._f.close()
            self._f = self._open()

    def _rotate(self) -> None:
        import fcntl

        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                st = None
            mine = os.fstat(self._f.fileno()).st_ino
            if st is not None and st.st_ino == mine and st.st_size >= self.max_bytes:
                for i in range(self.backups - 1, 0, -1):
                    older = self.path.with_name(f"{self.path.name}.{i}")
                    if older.exists():
                        os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
                if self.backups > 0:
                    os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                else:
                    self.path.unlink()
            self._f.close()
            self._f = self._open()


class PeerLimiter:
    """Log an event at most once per peer per ``interval_s``, and at most ``max_lines``
    lines per ``interval_s`` in all; what it holds back is counted, and the next line
    let through (that peer's, or any) says how many.

    Thread-safe; its memory is bounded by ``max_lines`` peers.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 60.0,
        max_lines: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.interval_s, self.max_lines = logger, interval_s, max_lines
        self._clock = clock
        self._lock = threading.Lock()
        self._logged: OrderedDict[str, float] = OrderedDict()  # peer: when, oldest first
        self._held: dict[str, int] = {}  # held back per peer still in _logged
        self._others = 0  # held back and not yet said, of peers no longer tracked
        self._window, self._lines = float("-inf"), 0

    def log(self, level: int, peer: str, msg: str, *args: Any, exc_info: Any = None) -> bool:
        """Log ``msg % args`` for ``peer`` unless held back; True when logged."""
        with self._lock:
            now = self._clock()
            while self._logged:  # forget peers last logged an interval ago
                oldest, when = next(iter(self._logged.items()))
                if now - when < self.interval_s:
                    break
                del self._logged[oldest]
                self._others += self._held.pop(oldest, 0)
            if peer in self._logged:
                self._held[peer] = self._held.get(peer, 0) + 1
                return False
            if now - self._window >= self.interval_s:
                self._window, self._lines = now, 0
            if self._lines >= self.max_lines:
                self._others += 1
                return False
            self._lines += 1
            self._logged[peer] = now
            others, self._others = self._others, 0
        text = msg % args if args else msg
        if others:
            text += f" [{others} more like it not logged in the last {self.interval_s:g} s]"
        self.logger.log(level, "%s", text, exc_info=exc_info)
        return True
