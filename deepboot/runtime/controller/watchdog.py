"""Where the controller's loop is stuck, said while it is stuck.

The controller's loop must turn every poll (``/healthz`` goes 503 when it does not),
but a turn can block: a call into Ray that waits on a busy GCS, a store write behind
another process's lock. From outside, such a stall only shows as a hole in the
recording and a burst of catch-up ticks after it. :class:`TurnWatchdog` watches the
turns from a daemon thread; a turn that runs past ``limit_s`` is logged once, with
the loop thread's stack at that moment (where it waits), and again when it ends (how
long it took). It only reads: it never interrupts the turn.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("deepboot.controller")


class TurnWatchdog:
    """Logs a turn of a loop that runs longer than ``limit_s`` (see the module).

    Args:
        limit_s: A turn longer than this is reported (> 0).
        clock: Monotonic seconds (injected for tests).
        every_s: How often the thread looks (default: a quarter of ``limit_s``).
        logger: Where the reports go.
    """

    def __init__(
        self,
        limit_s: float,
        clock: Callable[[], float] = time.monotonic,
        every_s: float | None = None,
        logger: logging.Logger = log,
    ) -> None:
        if not limit_s > 0:
            raise ValueError(f"limit_s must be > 0, got {limit_s}")
        self.limit_s = limit_s
        self._clock = clock
        self._every = every_s if every_s is not None else limit_s / 4
        self._log = logger
        self._lock = threading.Lock()
        self._started: float | None = None  # the running turn's start
        self._thread_id: int | None = None  # the thread that runs it
        self._reported = False  # this turn's stall was logged
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stalls = 0
        """Turns reported so far."""

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Wrap one turn of the loop (in the loop's thread)."""
        with self._lock:
            self._started, self._reported = self._clock(), False
            self._thread_id = threading.get_ident()
        try:
            yield
        finally:
            with self._lock:
                started, reported = self._started, self._reported
                self._started = None
            if reported and started is not None:
                self._log.warning("the stalled turn ended after %.1f s", self._clock() - started)

    def check(self) -> str | None:
        """One look: the running turn's stack if it has just run past the limit (it is
        logged), else None. The thread calls this; so can a test."""
        with self._lock:
            started, ident = self._started, self._thread_id
            if started is None or self._reported or ident is None:
                return None
            elapsed = self._clock() - started
            if elapsed <= self.limit_s:
                return None
            self._reported = True
            self.stalls += 1
        frame = sys._current_frames().get(ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(gone)\n"
        self._log.warning(
            "the controller's loop has been in one turn for %.1f s (limit %.1f s); it is at:\n%s",
            elapsed,
            self.limit_s,
            stack.rstrip(),
        )
        return stack

    def start(self) -> None:
        """Start the watching thread (a daemon: it never holds up an exit)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="turn-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (waits at most one look for it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._every + 1.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.check()
            except Exception:  # noqa: BLE001 (a diagnostic never takes the controller down)
                self._log.exception("the turn watchdog failed; it goes on")
