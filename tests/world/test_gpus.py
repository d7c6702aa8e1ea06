"""The GPU ledger both worlds keep: decisions, failures and recovery, each checked."""

from __future__ import annotations

import pytest

from deepboot.core.cluster import ClusterSpec
from deepboot.core.errors import InvalidDecisionError
from deepboot.core.gpu import FAILURES, TRAINABLE, TRANSITIONS, GpuState
from deepboot.core.placement import Placement
from deepboot.scheduler import operations as ops
from deepboot.world.gpus import GpuBoard, apply_gpu_op

S = GpuState
CLUSTER = ClusterSpec.parse("2x2", 1)  # node 0: training, node 1: inference
TRAIN, INFER = (0, 0), (1, 0)


def board() -> GpuBoard:
    return GpuBoard(CLUSTER)


def placements(b: GpuBoard) -> dict[str, Placement]:
    return {job: Placement.of([g.node_id for g in gpus]) for job, gpus in b.holders()}


# (operations from an empty cluster, the GPU they end on, its state, service, job)
CASES = [
    ([ops.Bind(TRAIN, "a")], TRAIN, S.TRAINING, None, "a"),
    ([ops.Lend(INFER, "a")], INFER, S.LENT, None, "a"),
    ([ops.Lend(INFER, "a"), ops.Reclaim(INFER, "a")], INFER, S.FREE, None, None),
    ([ops.Bind(TRAIN, "a"), ops.Release(TRAIN, "a")], TRAIN, S.FREE, None, None),
    ([ops.StartReplica(INFER, "s", "t", cold=True, hits=0)], INFER, S.RUNNING, "s", None),
    ([ops.WarmReplica(INFER, "s", 9.0)], INFER, S.RUNNING, "s", None),
    (
        [ops.StartReplica(INFER, "s", "t", cold=True, hits=0), ops.ProtectReplica(INFER, 5.0)],
        INFER, S.PROTECT, "s", None,
    ),
    (
        [ops.StartReplica(INFER, "s", "t", cold=True, hits=0), ops.ProtectReplica(INFER, 5.0),
         ops.SleepReplica(INFER), ops.EvictReplica(INFER)],
        INFER, S.FREE, None, None,
    ),
    (
        [ops.StartReplica(INFER, "s", "t", cold=True, hits=0), ops.ProtectReplica(INFER, 5.0),
         ops.SleepReplica(INFER), ops.Lend(INFER, "a")],
        INFER, S.LENT, None, "a",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("steps", "gpu", "state", "service", "job"), CASES)
def test_each_operation_moves_its_gpu_as_the_transition_table_says(
    steps: list[ops.AnyOperation], gpu: tuple[int, int], state: S, service: str | None,
    job: str | None,
) -> None:  # fmt: skip
    b = board()
    for op in steps:
        if isinstance(op, ops.Lend) and b.get(op.gpu).state is S.SLEEP:
            apply_gpu_op(b, ops.EvictReplica(op.gpu))  # the loop evicts before it lends
        before = b.get(op.gpu).state
        apply_gpu_op(b, op)
        after = b.get(op.gpu).state
        assert after is before or after in TRANSITIONS[before]
    g = b.get(gpu)
    assert (g.state, g.service, g.job) == (state, service, job)
    b.check(placements(b))


@pytest.mark.parametrize(
    "steps",
    [
        [ops.ProtectReplica(INFER, 5.0)],  # FREE -> PROTECT
        [ops.SleepReplica(INFER)],  # FREE -> SLEEP
        [ops.Lend(INFER, "a"), ops.WarmReplica(INFER, "s", 9.0)],  # a warm-up never reclaims
        [ops.Bind(TRAIN, "a"), ops.Bind(TRAIN, "b")],  # two jobs on one GPU
        [ops.StartReplica(INFER, "s", "t", cold=True, hits=0), ops.Lend(INFER, "a")],
    ],
)
def test_an_illegal_change_is_refused(steps: list[ops.AnyOperation]) -> None:
    b = board()
    with pytest.raises(InvalidDecisionError):
        for op in steps:
            apply_gpu_op(b, op)


def test_a_failure_empties_a_gpu_by_its_own_table_never_a_decisions() -> None:
    b = board()
    apply_gpu_op(b, ops.StartReplica(INFER, "s", "t", cold=True, hits=0))
    g = b.get(INFER)
    g.replica = "r|s|1.0|1"
    with pytest.raises(InvalidDecisionError, match="RUNNING -> FREE"):
        b.move(g, S.FREE)  # no decision empties a serving replica
    b.fail(g)  # its process died: a fact
    assert (g.state, g.service, g.replica) == (S.FREE, None, None)
    with pytest.raises(InvalidDecisionError, match="illegal failure FREE -> FREE"):
        b.fail(g)
    assert all(FAILURES[s] <= {S.FREE, S.DOWN} for s in S)
    apply_gpu_op(b, ops.Bind(TRAIN, "a"))
    b.fail(b.get(TRAIN))  # a worker died
    assert not b.held("a")
    b.check({})


def test_a_gpu_whose_node_left_is_down_until_it_returns_and_no_decision_uses_it() -> None:
    b = board()
    apply_gpu_op(b, ops.Lend(INFER, "a"))
    g = b.get(INFER)
    with pytest.raises(InvalidDecisionError, match="illegal failure LENT -> DOWN"):
        b.fail(g, S.DOWN)  # its worker fails first (the job learns it lost it)
    b.fail(g)
    b.fail(g, S.DOWN)
    assert (g.state, g.job) == (S.DOWN, None) and b.counts()[S.DOWN] == 1
    assert S.DOWN not in TRAINABLE and not TRANSITIONS[S.DOWN]
    for op in (ops.Lend(INFER, "a"), ops.StartReplica(INFER, "s", "t", cold=True, hits=0)):
        with pytest.raises(InvalidDecisionError, match="DOWN"):
            apply_gpu_op(b, op)
    b.fail(g, S.FREE)  # the node came back
    assert g.state is S.FREE
    b.check({})


def test_recovery_restores_what_the_rows_say_and_refuses_what_does_not_fit() -> None:
    b = board()
    b.restore(b.get(INFER), S.PROTECT, service="s", replica="r", hits=2, protect_until=7.0)
    b.restore(b.get((1, 1)), S.SLEEP, service="s", replica="q")
    b.restore(b.get(TRAIN), S.TRAINING, job="a")
    assert b.get(INFER).protect_until == 7.0 and b.get(INFER).hits == 2
    assert [g.gpu_id for g in b.held("a")] == [TRAIN]
    b.check(placements(b))
    bad = [
        (TRAIN, S.TRAINING, {"job": "b"}),  # not FREE any more
        ((0, 1), S.LENT, {"job": "b"}),  # a training-pool GPU is never LENT
        ((0, 1), S.SLEEP, {}),  # a replica without its service
        ((0, 1), S.PROTECT, {"service": "s"}),  # PROTECT without its end
    ]
    for gpu, state, fields in bad:
        with pytest.raises(InvalidDecisionError, match="cannot restore"):
            b.restore(b.get(gpu), state, **fields)  # type: ignore[arg-type]
