"""Processes on this machine, read from Linux's ``/proc``: which run, which a mark on
their command line names (with their descendants), the controller's, and stopping
them (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from deepboot.runtime.store.statedir import StateDir


def command_lines() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process we can read (Linux /proc)."""
    out: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat_line = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        cmd = raw.replace(b"\0", b" ").decode(errors="replace")
        ppid = int(stat_line.rsplit(")", 1)[1].split()[1])
        out[pid] = (ppid, cmd)
    return out


def marked_with_descendants(marks: re.Pattern[str]) -> set[int]:
    """The processes whose command line ``marks`` matches (never this one), and all
    their descendants."""
    procs = command_lines()
    roots = {pid for pid, (_, cmd) in procs.items() if marks.search(cmd)}
    roots.discard(os.getpid())
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


KILL_WAIT_S = 2.0
"""How long :func:`kill_pids` waits for SIGKILLed processes to be gone."""


def kill_pids(pids: Iterable[int], grace: float = 5.0) -> set[int]:
    """SIGTERM, then SIGKILL what is left after ``grace`` seconds, and wait up to
    :data:`KILL_WAIT_S` for those to be gone; returns the pids still alive then
    (none, unless a process is stuck in the kernel)."""
    pending = set(pids)
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pending and time.monotonic() < deadline:
        pending = {p for p in pending if process_alive(p)}
        time.sleep(0.1)
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = {p for p in pending if process_alive(p)}
    return pending


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def controller_alive(state: StateDir) -> int | None:
    """The controller's pid if it runs, else None (the pid file names a live process
    whose command line is the controller's: a reused pid is not taken for it)."""
    try:
        pid = int(state.controller_pid.read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not process_alive(pid):
        return None
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if b"deepboot.runtime.controller_process" in cmd else None
