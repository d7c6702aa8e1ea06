"""The GPU ledger with replicas that span several GPUs of one node: all of a
replica's GPUs move together, or the operation is refused (a split replica)."""

from __future__ import annotations

import pytest

from deepboot.core.cluster import ClusterSpec
from deepboot.core.errors import InvalidDecisionError
from deepboot.core.gpu import GpuState
from deepboot.scheduler import operations as ops
from deepboot.world.gpus import GpuBoard, apply_gpu_op

CLUSTER = ClusterSpec.parse("3x4", 2)  # node 0 training; nodes 1, 2 inference
PAIR = ((1, 0), (1, 1))


def started() -> GpuBoard:
    b = GpuBoard(CLUSTER)
    apply_gpu_op(b, ops.StartReplica((1, 0), "s", "t", cold=True, hits=0, gpus=PAIR))
    return b


def states(b: GpuBoard) -> dict[tuple[int, int], tuple[GpuState, str | None, tuple]]:
    return {g.gpu_id: (g.state, g.service, g.replica_gpus) for g in b.gpus if g.node_id == 1}


def test_a_replica_of_two_gpus_moves_through_its_lifecycle_together() -> None:
    b = started()
    assert states(b)[(1, 1)] == (GpuState.RUNNING, "s", PAIR)
    for op, state in (
        (ops.ProtectReplica((1, 0), 5.0, PAIR), GpuState.PROTECT),
        (ops.SleepReplica((1, 0), PAIR), GpuState.SLEEP),
        (ops.StartReplica((1, 0), "s", "t2", cold=False, hits=0, gpus=PAIR), GpuState.RUNNING),
        (ops.ProtectReplica((1, 0), 9.0, PAIR), GpuState.PROTECT),
        (ops.SleepReplica((1, 0), PAIR), GpuState.SLEEP),
    ):
        apply_gpu_op(b, op)
        assert [states(b)[g][0] for g in PAIR] == [state, state]
        b.check({})
    assert b.views()[CLUSTER.nodes[0].gpus + 1].replica_gpus == PAIR  # (1, 1)'s view
    apply_gpu_op(b, ops.EvictReplica((1, 0), PAIR))
    assert [states(b)[g] for g in PAIR] == [(GpuState.FREE, None, ())] * 2
    assert b.evictions == 1
    b.check({})


@pytest.mark.parametrize(
    ("op", "message"),
    [
        (ops.EvictReplica((1, 0)), "must name all of its GPUs"),
        (ops.ProtectReplica((1, 1), 5.0), "must name all of its GPUs"),
        (ops.ProtectReplica((1, 0), 5.0, ((1, 0),)), "moves as a whole"),
        (ops.ProtectReplica((1, 0), 5.0, ((1, 0), (1, 1), (1, 2))), "moves as a whole"),
    ],
    ids=["evict-lead-alone", "protect-member-alone", "protect-part", "protect-more"],
)
def test_an_operation_on_part_of_a_replica_is_refused(op: ops.GpuOperation, message: str) -> None:
    b = started()
    before = states(b)
    with pytest.raises(InvalidDecisionError, match=message):
        apply_gpu_op(b, op)
    assert states(b) == before


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        (((1, 0), (2, 0)), "one node"),  # split over two nodes
        (((1, 1), (1, 0)), "index order"),  # lead not first
        (((1, 2), (1, 2)), "distinct"),
        (((1, 2), (1, 0)), "lead first"),
    ],
)
def test_a_new_replica_must_be_distinct_gpus_of_one_node(
    gpus: tuple[tuple[int, int], ...], message: str
) -> None:
    b = GpuBoard(CLUSTER)
    with pytest.raises(InvalidDecisionError, match=message):
        apply_gpu_op(b, ops.StartReplica(gpus[0], "s", "t", cold=True, hits=0, gpus=gpus))
    assert all(g.state is GpuState.FREE for g in b.gpus)


def test_a_new_replica_needs_every_gpu_free() -> None:
    b = GpuBoard(CLUSTER)
    apply_gpu_op(b, ops.Lend((1, 1), "a"))
    with pytest.raises(InvalidDecisionError, match=r"\[\(1, 1\)\] are not FREE"):
        apply_gpu_op(b, ops.WarmReplica((1, 0), "s", 9.0, PAIR))
    assert b.get((1, 0)).state is GpuState.FREE
