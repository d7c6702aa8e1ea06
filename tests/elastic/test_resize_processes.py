"""AFE resizes, failures and restarts on real torch processes (gloo on the CPU).

The test plays the controller: it offers generations to worker processes and reads
their reports, as the runtime's controller does through Ray.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from deepboot.elastic.protocol import Restore, WorkerStatus  # noqa: E402
from tests.elastic.harness import gen, spawn, stop_all, wait_until  # noqa: E402

pytestmark = pytest.mark.runtime


def _formed(number: int):
    return lambda r: (
        r.generation >= number and r.status in (WorkerStatus.RUNNING, WorkerStatus.DONE)
    )


def test_grow_then_shrink_keeps_the_parameters_exactly(tmp_path: Path) -> None:
    g1 = gen(tmp_path, 1, ["1", "2"])
    a, b = spawn("1", g1, steps=600), spawn("2", g1, steps=600)
    procs = [a, b]
    try:
        first = wait_until([a, b], lambda r: r.generation == 1 and r.step >= 20)
        # Different initial models: the group starts from rank 0's.
        assert len({r.digests[1][1] for r in first.values()}) == 1
        g2 = gen(tmp_path, 2, ["1", "2", "3"], local_bsz=4)
        c = spawn("3", g2, steps=600)
        procs.append(c)
        for p in (a, b):
            p.offer(g2)
        grown = wait_until([a, b, c], _formed(2))
        before, after = grown["1"].digests[2]
        assert before == after == grown["2"].digests[2][0] == grown["2"].digests[2][1]
        assert grown["3"].digests[2][1] == after  # the joiner took rank 0's state
        assert grown["3"].digests[2][0] != after  # ... which was not its own
        g3 = gen(tmp_path, 3, ["1", "3"])
        for p in (a, b, c):
            p.offer(g3)
        wait_until([b], lambda r: r.status is WorkerStatus.DEPARTED)
        shrunk = wait_until([a, c], _formed(3))
        assert shrunk["1"].digests[3][0] == shrunk["1"].digests[3][1] == shrunk["3"].digests[3][1]
        done = wait_until([a, c], lambda r: r.status is WorkerStatus.DONE)
        assert done["1"].step == done["3"].step == 600
    finally:
        stop_all(procs)


def test_a_dead_peer_costs_at_most_one_step(tmp_path: Path) -> None:
    g1 = gen(tmp_path, 1, ["1", "2", "3"])
    procs = [spawn(w, g1, steps=400) for w in ("1", "2", "3")]
    a, b, c = procs
    try:
        wait_until(procs, lambda r: r.generation == 1 and r.step >= 30)
        os.kill(c.process.pid, signal.SIGKILL)
        broken = wait_until([a, b], lambda r: r.status is WorkerStatus.WAITING)
        at_failure = max(r.step for r in broken.values())
        g2 = gen(tmp_path, 2, ["1", "2"])
        for p in (a, b):
            p.offer(g2)
        resumed = wait_until([a, b], _formed(2))
        assert resumed["1"].digests[2][1] == resumed["2"].digests[2][1]
        assert at_failure - resumed["1"].restored_step <= 1
        done = wait_until([a, b], lambda r: r.status is WorkerStatus.DONE)
        assert done["1"].step == 400
    finally:
        stop_all(procs)


def test_restart_resize_restores_the_checkpoint_in_new_processes(tmp_path: Path) -> None:
    g1 = gen(tmp_path, 1, ["1", "2"])
    old = [spawn("1", g1, steps=300), spawn("2", g1, steps=300)]
    procs = list(old)
    try:
        wait_until(old, lambda r: r.generation == 1 and r.step >= 20)
        stop = gen(tmp_path, 2, ["1", "2"], stop=True)
        for p in old:
            p.offer(stop)
        left = wait_until(old, lambda r: r.status is WorkerStatus.DEPARTED)
        stopped_at = left["1"].step
        g3 = gen(tmp_path, 3, ["3", "4", "5"], restore=Restore.CHECKPOINT, after=2)
        new = [spawn(w, g3, steps=300) for w in ("3", "4", "5")]
        procs += new
        formed = wait_until(new, _formed(3))
        assert {r.restored_step for r in formed.values()} == {stopped_at}
        assert len({r.digests[3][1] for r in formed.values()}) == 1
        done = wait_until(new, lambda r: r.status is WorkerStatus.DONE)
        assert {r.step for r in done.values()} == {300}
    finally:
        stop_all(procs)


def test_a_wait_for_a_checkpoint_that_never_comes_ends_when_a_later_generation_is_offered(
    tmp_path: Path,
) -> None:
    """The stop it waits for never wrote (its generation had not formed): the next
    generation the controller offers (from whatever the file holds) forms at once,
    not after the join timeout (120 s here)."""
    g2 = gen(tmp_path, 2, ["1"], restore=Restore.CHECKPOINT, after=1)  # never written
    procs = [spawn("1", g2, steps=50)]
    try:
        waiting = wait_until(procs, lambda r: r.status is WorkerStatus.JOINING)
        assert waiting["1"].generation < 2
        procs[0].offer(gen(tmp_path, 3, ["1"], restore=Restore.CHECKPOINT, after=0))
        formed = wait_until(procs, _formed(3), timeout=60.0)
        assert formed["1"].restored_step == 0  # no checkpoint at all: a fresh start
    finally:
        stop_all(procs)


def test_a_joiner_slower_than_the_collective_timeout_still_joins(tmp_path: Path) -> None:
    """Members wait for each other for the join timeout, not the (short) collective
    timeout: a joiner's process start may take long on a loaded machine."""
    import time

    g1 = gen(tmp_path, 1, ["1", "2", "3"])
    early = [spawn("1", g1, steps=100), spawn("2", g1, steps=100)]
    procs = list(early)
    try:
        time.sleep(20)  # longer than the harness's 15 s collective timeout
        procs.append(spawn("3", g1, steps=100))
        formed = wait_until(procs, _formed(1))
        assert {r.broken for r in formed.values()} == {0}
        assert len({r.digests[1][1] for r in formed.values()}) == 1
    finally:
        stop_all(procs)


def test_a_member_whose_rendezvous_failed_inside_the_group_still_forms_the_next(
    tmp_path: Path,
) -> None:
    """Two reclaims in a row (the lull/spike/lull run's livelock): worker 2 arrives at
    generation 2's rendezvous and leaves it for generation 3 at once; worker 1 then
    finds both arrived, starts the group alone, and fails inside it (the collective
    timeout). Generation 3 must form: torch had named worker 1's next group one
    further than worker 2's, and every later rendezvous waited on keys nobody wrote."""
    g1 = gen(tmp_path, 1, ["1", "2"])
    a, b = spawn("1", g1), spawn("2", g1)
    procs = [a, b]
    try:
        wait_until(procs, lambda r: r.generation == 1 and r.step >= 20)
        g2, g3 = gen(tmp_path, 2, ["1", "2"]), gen(tmp_path, 3, ["1", "2"])
        b.offer(g2)
        wait_until([b], lambda r: r.status is WorkerStatus.JOINING)  # arrived at 2
        b.offer(g3)  # superseded before the group: b never starts generation 2's
        wait_until([b], lambda r: r.broken >= 2)
        a.offer(g2)
        failed = wait_until([a], lambda r: r.broken >= 2)  # alone in the group: timed out
        assert failed["1"].generation == 1
        a.offer(g3)
        formed = wait_until(procs, _formed(3), timeout=120)
        assert formed["1"].digests[3][1] == formed["2"].digests[3][1]
    finally:
        stop_all(procs)


def test_a_generations_first_step_is_not_measured(tmp_path: Path) -> None:
    """The throughput fit gets every step but each generation's first (its warm-up):
    100 steps over two generations give 98 measurements, each of its own generation's
    size."""
    g1 = gen(tmp_path, 1, ["1", "2"])
    a, b = spawn("1", g1, steps=100, delay=0.05), spawn("2", g1, steps=100, delay=0.05)
    procs = [a, b]
    measured: list[int] = []  # the world size of each measurement, in order
    try:
        # The move is offered once generation 1 has taken a few steps: offered as
        # soon as it runs, it can reach the first step's collective (slow: gloo
        # connects on it) and move the job after that unmeasured step, leaving
        # generation 1 no measurement at all. Every report's measurements are kept
        # (a report hands them over once).
        deadline = time.monotonic() + 90
        while True:
            r = a.report()
            measured += [m.num_replicas for m in r.measurements]
            if r.status is WorkerStatus.RUNNING and r.step >= 5:
                break
            assert time.monotonic() < deadline, f"generation 1 did not run: {r}"
            time.sleep(0.1)
        g2 = gen(tmp_path, 2, ["1"])
        for p in (a, b):  # early (95 steps left): the move comes at a step boundary
            p.offer(g2)
        deadline = time.monotonic() + 90
        while True:
            r = a.report()
            measured += [m.num_replicas for m in r.measurements]
            if r.status is WorkerStatus.DONE:
                break
            assert time.monotonic() < deadline, f"not done: {r}"
            time.sleep(0.1)
        at_two = measured.count(2)
        at_one = measured.count(1)
        assert measured == [2] * at_two + [1] * at_one
        # Every step of the 100 but the first of each generation.
        assert at_two + at_one == 100 - 2
        assert at_two >= 1 and at_one >= 1
    finally:
        stop_all(procs)
