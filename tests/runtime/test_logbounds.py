"""The controller's log, bounded (issue 42, finding 3): it rotates (records and what
descriptors 1 and 2 get alike), keeps a crash's last words, and ``deepboot up`` still
shows its end when the controller fails to start; the endpoint's per-peer logging
limit (deepboot.runtime.logbounds)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deepboot.core.errors import ConfigError
from deepboot.runtime import logbounds
from deepboot.runtime.store.statedir import StateDir

pytestmark = pytest.mark.runtime

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_peer_is_logged_once_per_interval_and_all_peers_in_a_few_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    limiter = logbounds.PeerLimiter(logging.getLogger("t.limit"), 60.0, 3, clock)
    caplog.set_level(logging.INFO, "t.limit")
    said = [limiter.log(logging.WARNING, "a", "from %s", "a") for _ in range(1000)]
    assert said[0] and not any(said[1:])
    for peer in "bcdefg":  # 3 lines an interval in all: b and c, then held back
        limiter.log(logging.WARNING, peer, "from %s", peer)
    assert [r.getMessage() for r in caplog.records] == ["from a", "from b", "from c"]
    clock.now = 61.0
    assert limiter.log(logging.WARNING, "a", "from %s", "a")
    # What was held back is said: a's 999, and d, e, f, g's one each.
    assert caplog.records[-1].getMessage() == (
        "from a [1003 more like it not logged in the last 60 s]"
    )
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_the_log_rotates_with_what_descriptors_1_and_2_get(tmp_path: Path) -> None:
    """In a process of its own (the setup takes descriptors 1 and 2): 60 KB of records
    and 200 KB of raw output on a log of 20,000 bytes and 2 old ones."""
    path = tmp_path / "controller.log"
    script = textwrap.dedent(
        """
        import logging, os, sys, time
        from pathlib import Path
        from deepboot.runtime import logbounds

        logbounds.RAW_CHECK_S = 0.05
        path = Path(sys.argv[1])
        logbounds.configure(path, max_bytes=20_000, backups=2)
        log = logging.getLogger("t")
        for i in range(400):
            log.info("record %d %s", i, "x" * 100)
        for i in range(40):  # bursts of 5 KB, alternately on 1 and 2
            os.write(1 + i % 2, (f"raw {i} " + "y" * 1000 + "\\n").encode() * 5)
            deadline = time.monotonic() + 10  # the watcher rolls it over (polled)
            while time.monotonic() < deadline:
                try:
                    if path.stat().st_size < 20_000:
                        break
                except FileNotFoundError:  # between the rename and the new file
                    pass
                time.sleep(0.01)
        print("printed last")
        raise RuntimeError("the last words")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 1
    assert proc.stdout == "" and proc.stderr == "", (proc.stdout, proc.stderr)  # all in the log
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["controller.log", "controller.log.1", "controller.log.2"], files
    for p in tmp_path.iterdir():
        # its size, passed by at most one burst (5 KB) before the watcher's check
        assert p.stat().st_size <= 20_000 + 5 * 1008, (p.name, p.stat().st_size)
    current = path.read_text()
    assert "raw 39 " in current and "printed last" in current
    assert "RuntimeError: the last words" in current  # the traceback at exit


def test_tail_reads_across_a_rollover(tmp_path: Path) -> None:
    path = tmp_path / "controller.log"
    assert logbounds.tail(path) == ""
    path.with_name("controller.log.1").write_text("".join(f"old {i}\n" for i in range(30)))
    path.write_text("new 0\nnew 1\n")
    assert logbounds.tail(path, 4).splitlines() == ["old 28", "old 29", "new 0", "new 1"]
    path.write_text("".join(f"line {i}\n" for i in range(10_000)))  # only its end is read
    got = logbounds.tail(path, 3, window=1000).splitlines()
    assert got == ["line 9997", "line 9998", "line 9999"]


def test_a_failed_start_still_shows_the_end_of_the_log(tmp_path: Path) -> None:
    from deepboot.runtime.cluster import updown as lifecycle

    state = StateDir.at(str(tmp_path / "state")).ensure()
    (state.logs / "controller.log.1").write_text("".join(f"old {i}\n" for i in range(30)))
    (state.logs / "controller.log").write_text("new 0\nRuntimeError: no Ray here\n")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(ConfigError) as err:
        lifecycle.wait_for_endpoint(state, dead.pid, timeout=10)
    tail = str(err.value).split("its log ends:\n", 1)[1].splitlines()
    assert tail == [f"old {i}" for i in range(17, 30)] + ["new 0", "RuntimeError: no Ray here"]


def test_a_log_two_processes_append_to_stays_bounded(tmp_path: Path) -> None:
    """Two writers at once (a service's replicas, a job's workers), 2 x 300 KB of lines
    on a log of 20,000 bytes and 2 old ones: never more files, each at most its size
    and a line of each writer over, every line whole, the last one in the current
    file."""
    path = tmp_path / "service-x.log"
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from deepboot.runtime.logbounds import SharedLog

        out = SharedLog(Path(sys.argv[1]), max_bytes=20_000, backups=2)
        me = sys.argv[2]
        for i in range(3000):
            print(f"{me} line {i} " + "w" * 80, file=out)
        out.close()
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(path), me], cwd=REPO)
        for me in ("a", "b")
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"service-x.log{s}" for s in ("", ".1", ".2", ".lock")], files
    for p in tmp_path.iterdir():
        # a line of each writer over at most (one may write into a file just rotated)
        assert p.stat().st_size <= 20_000 + 2 * 100, (p.name, p.stat().st_size)
    lines = [ln for f in files[:3] for ln in (tmp_path / f).read_text().splitlines()]
    assert all(re.fullmatch(r"[ab] line \d+ w{80}", ln) for ln in lines)  # whole lines
    assert path.read_text().splitlines()[-1].split()[1:3] == ["line", "2999"]


def test_a_service_replica_writes_its_output_to_a_bounded_log(tmp_path: Path) -> None:
    """What a replica's handler prints (``ServiceReplica._log_to``, the call a replica
    makes when it starts serving) rolls over at ``LOG_BYTES`` and keeps ``LOG_BACKUPS``
    old files: 60 MiB of prints leave that many files, each within a line of the
    bound, the newest line last."""
    path = tmp_path / "service-x.log"
    script = textwrap.dedent(
        """
        import sys
        from deepboot.runtime.actors.replica_actor import ServiceReplica

        ServiceReplica._log_to(sys.argv[1])
        line = "x" * 1023
        for i in range(60 * 1024):
            print(line)
        print("last", file=sys.stderr)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(path)], cwd=REPO, capture_output=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir() if p.suffix != ".lock"}
    kept = ["service-x.log"] + [f"service-x.log.{i}" for i in range(1, logbounds.LOG_BACKUPS + 1)]
    assert sorted(sizes) == kept, sizes
    assert all(n <= logbounds.LOG_BYTES + 1024 for n in sizes.values()), sizes
    assert path.read_text().splitlines()[-1] == "last"
