"""A supervised child process: the one way deepboot runs a user's own program (a
command job's rank, :mod:`deepboot.elastic.command`; a command service's server,
:mod:`deepboot.runtime.actors.command_replica`).

The rules, the same for both:

- the child runs in a session of its own, so a stop signals its whole process group
  (a ``torchrun``-style launcher's workers, a server's engine processes);
- it dies with the thread that started it (``PR_SET_PDEATHSIG``): an actor Ray kills
  never leaves a program running on a GPU the scheduler has given to someone else;
- each line it prints goes to a log with a prefix (``deepboot logs``), and the last
  lines of its stderr are kept for a failure's message;
- a stop is SIGTERM to the group, then SIGKILL after a grace: every wait is bounded.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO

TAIL_LINES = 20
"""Lines of a process's stderr kept for a failure's message."""

PUMP_JOIN_S = 5.0
"""Longest wait for a process's output to drain after it exited (a grandchild that
holds the pipe open must not hold the caller)."""

PYTHON_NAMES = frozenset({"python", "python3", f"python3.{sys.version_info[1]}"})
"""A command's first word that means "the worker's own interpreter": the one Ray runs
deepboot and torch with, not whatever ``python`` a node's PATH finds first."""


def resolve_argv(command: Sequence[str]) -> list[str]:
    """``command`` with ``python`` (and ``python3``, ``python3.N``) meaning this
    interpreter (see :data:`PYTHON_NAMES`)."""
    argv = list(command)
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = sys.executable
    return argv


def _die_with_parent() -> None:
    """(In the child, before exec) SIGKILL when the thread that started us dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Supervised:
    """One child process under the rules of the module docstring.

    Args:
        argv: The program and its arguments (``python`` already resolved, or not:
            :func:`resolve_argv` is applied).
        cwd: Its working directory ("" or None: the caller's).
        env: Its whole environment.
        write: Receives every line it prints (stdout and stderr), one call per line,
            with its newline; called from the pump threads.
        on_stdout: Called with each stdout line before it is written (a command job's
            first line is its first progress); optional.

    Raises:
        OSError: the program could not be started (not found, not executable).
    """

    def __init__(
        self,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str],
        write: Callable[[str], None],
        on_stdout: Callable[[str], None] | None = None,
    ) -> None:
        self._write, self._on_stdout = write, on_stdout
        self._lock = threading.Lock()
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.argv = resolve_argv(argv)
        self.proc: subprocess.Popen[bytes] = subprocess.Popen(  # noqa: S603 (the user's own program, by design)
            self.argv,
            cwd=cwd or None,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: a stop signals its children too
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (only a prctl before exec)
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, False), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, True), daemon=True),
        ]
        for t in self._pumps:
            t.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        """Its exit status, or None while it runs."""
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to exit (at most ``timeout`` s), then for its output to drain
        (at most :data:`PUMP_JOIN_S`); its exit status.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout``.
        """
        rc = self.proc.wait(timeout=timeout)
        for t in self._pumps:
            t.join(timeout=PUMP_JOIN_S)
        return rc

    def tail(self) -> list[str]:
        """The last lines of its stderr (at most :data:`TAIL_LINES`)."""
        with self._lock:
            return list(self._tail)

    def stop(self, grace_s: float, say: Callable[[str], None] | None = None) -> int:
        """SIGTERM to its process group; SIGKILL after ``grace_s``; its exit status
        (bounded: ``grace_s`` plus the kill's own short wait)."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        if say is not None:
            say(f"stopping: SIGTERM, SIGKILL after {grace_s:g} s\n")
        self._signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            if say is not None:
                say(f"still running {grace_s:g} s after SIGTERM: SIGKILL\n")
            self._signal(signal.SIGKILL)
            return self.proc.wait(timeout=PUMP_JOIN_S)

    def stop_in_background(self, grace_s: float, say: Callable[[str], None] | None = None) -> None:
        """:meth:`stop` in a thread of its own (the caller does not wait)."""
        threading.Thread(target=self.stop, args=(grace_s, say), daemon=True).start()

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def _pump(self, stream: IO[bytes], is_err: bool) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            if not line.endswith("\n"):
                line += "\n"
            if is_err:
                with self._lock:
                    self._tail.append(line.rstrip("\n"))
            elif self._on_stdout is not None:
                self._on_stdout(line)
            self._write(line)
