"""One controller per state directory, by an OS lock (``runtime/store/statelock.py``): real
processes hold it; a second holder is refused with the first's pid; the lock dies with
its holder, SIGKILL included. No Ray: the controller refuses before it connects."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deepboot.runtime.store.statedir import StateDir
from deepboot.runtime.store.statelock import HeldElsewhereError, StateLock, holding

HOLD = """
import sys, time
from pathlib import Path
from deepboot.runtime.store.statelock import StateLock
StateLock(Path(sys.argv[1]), "a controller").acquire()
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process holding the state directory's controller lock."""
    state = StateDir.at(tmp_path / "state").ensure()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(state.controller_lock)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def test_a_second_holder_is_refused_with_the_first_ones_pid(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    lock = StateLock(StateDir.at(tmp_path / "state").controller_lock, "a controller")
    with pytest.raises(HeldElsewhereError, match=f"a controller already runs .*pid {holder.pid}"):
        lock.acquire()
    assert not lock.held


def test_a_controller_started_by_hand_exits_naming_the_running_one(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "deepboot.runtime.controller_process",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("deepboot: a controller already runs") and str(holder.pid) in line
    # It wrote nothing: the pid file still names nobody else.
    assert not StateDir.at(tmp_path / "state").controller_pid.exists()


def test_the_lock_dies_with_its_holder_even_by_sigkill(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(10)
    with holding(StateDir.at(tmp_path / "state").controller_lock, "a controller") as lock:
        assert lock.held
        assert lock.path.read_text() == str(os.getpid())


def test_a_waiting_holder_gets_the_lock_once_it_is_free(tmp_path: Path) -> None:
    path = tmp_path / "up.lock"
    first = StateLock(path, "'deepboot up'").acquire()
    with pytest.raises(HeldElsewhereError, match="'deepboot up' already runs"):
        StateLock(path, "'deepboot up'").acquire(wait_s=0.2)
    first.release()
    second = StateLock(path, "'deepboot up'").acquire(wait_s=5.0)
    assert second.held
    second.release()
