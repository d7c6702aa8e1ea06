"""A Ray node that dies takes its GPUs out of the ledger until it is back, on a real
local cluster (1 training + 1 inference node x 2 logical GPUs, real torch workers):
a job that borrowed both inference GPUs loses its workers there when that node's
raylet is SIGKILLed, re-forms on the training node, is given nothing on the dead
node, borrows it again once the node is started again, and finishes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.core.cluster import Node, Pool  # noqa: E402
from deepboot.runtime.cluster.processes import command_lines  # noqa: E402
from deepboot.runtime.cluster.raycluster import (  # noqa: E402
    ClusterRecord,
    cluster_pids,
    start_local_node,
)
from deepboot.runtime.store.jobstore import LogKind  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from tests.runtime.cluster_helpers import (  # noqa: E402
    alive,
    cli,
    events,
    job,
    local_cluster,
    wait_for,
)
from tests.runtime.serving_helpers import gated_job, open_gate  # noqa: E402

pytestmark = pytest.mark.runtime


def _node_processes(record: ClusterRecord, node: int) -> set[int]:
    """The processes of one Ray node: those naming its deepboot resource, and theirs."""
    ours = cluster_pids(record)
    procs = command_lines()  # after: a process of ``ours`` may have ended, none started
    roots = {p for p in ours if p in procs and f"deepboot_node_{node}" in procs[p][1]}
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(c for c, (ppid, _) in procs.items() if ppid == pid)
    return found


def _node_ops(state: Path) -> list[str]:
    return [e.detail["op"] for e in events(state) if e.kind is LogKind.NODE]


def test_a_dead_node_leaves_the_ledger_until_it_returns(tmp_path: Path) -> None:
    state = tmp_path / "state"
    flags = ("--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "2")
    with local_cluster(state, *flags, own=True):  # it kills a Ray node
        record = ClusterRecord.load(StateDir.at(state))
        gate = tmp_path / "gate"
        cli(state, "submit", str(gated_job(tmp_path, "trainer", gate, max_workers=4)))
        wait_for(
            "the job to borrow both inference GPUs",
            lambda: sorted(job(state, "trainer")["workers"]) == ["0.0", "0.1", "1.0", "1.1"],
        )
        doomed = _node_processes(record, 1)
        assert doomed
        for pid in doomed:
            os.kill(pid, signal.SIGKILL)
        wait_for("the controller to see node 1 leave", lambda: _node_ops(state) == ["left"])
        wait_for(
            "the job to re-form on node 0",
            lambda: (
                sorted(job(state, "trainer")["workers"]) == ["0.0", "0.1"]
                and not job(state, "trainer")["lent_gpus"]
            ),
        )
        failed = {e.detail["worker"] for e in events(state, "trainer")
                  if e.kind is LogKind.WORKER_FAILED}  # fmt: skip
        assert failed == {"1.0", "1.1"}
        assert job(state, "trainer")["state"] == "running"
        assert not any(alive(p) for p in doomed)

        start_local_node(record, Node(1, 2, Pool.INFERENCE))
        wait_for("node 1 back", lambda: _node_ops(state) == ["left", "returned"])
        wait_for("the job to borrow again", lambda: len(job(state, "trainer")["lent_gpus"]) == 2)
        open_gate(state, "trainer", gate)
        wait_for("trainer to finish", lambda: job(state, "trainer")["state"] == "finished")
        assert [e.kind for e in events(state, "trainer")].count(LogKind.FINISHED) == 1
