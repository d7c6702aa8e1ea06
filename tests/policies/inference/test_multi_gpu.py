"""ATS-I for a replica of k GPUs of one node (``gpus_per_replica``), the loss of a set
of reclaims, and the preference for a sleeping server's own GPUs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from deepboot.core import InferenceState, JobMode
from deepboot.core.errors import ConfigError
from deepboot.perf.speedup import speedup_fn
from deepboot.policies.allocation import fair_replicas, fair_share_base
from deepboot.policies.inference import (
    InferencePlacement,
    PlaceAction,
    create,
    reclaim_losses,
)
from deepboot.policies.inference.candidates import lent_gpus
from deepboot.policies.inference.multi import set_loss
from deepboot.scheduler.inference import validate_placement

from .builders import layout

FITTED = {"a": {"fitted": True}, "b": {"fitted": True}}
RNG = np.random.default_rng(0)


def place(state: InferenceState, k: int = 2, service: str = "s") -> InferencePlacement | None:
    st = dataclasses.replace(state, gpus_per_replica=k)
    out = create("ats-i").place(st, service, RNG)
    if out is not None:
        validate_placement(out, st, service)  # every placement here passes the scheduler
    return out


def test_the_loss_of_one_gpu_is_reclaim_losses() -> None:
    state = layout("T:a T:a T:b F", "L:a L:a L:b L:b", jobs=FITTED)
    lent = lent_gpus(state)
    single = reclaim_losses(state, lent)
    assert [set_loss(state, [g]) for g in lent] == pytest.approx(list(single))


def test_the_loss_of_two_gpus_of_one_job_is_its_speedup_before_minus_after() -> None:
    state = layout("T:a T:a F F", "L:a L:a F F", jobs=FITTED)
    job = state.job("a")
    fn = speedup_fn(job, JobMode.ADAPTIVE)
    usable = sum(1 for g in state.gpus)  # none RUNNING or PROTECT
    base = fair_share_base(fn, fair_replicas(usable, len(state.jobs)))
    s = fn(np.array([2, 1]), np.array([4, 2]))
    want = (float(s[0]) - float(s[1])) / base
    lent = lent_gpus(state)
    assert set_loss(state, lent) == pytest.approx(want)
    # Not the sum of the one-GPU losses (each sees the job at 4 GPUs).
    assert set_loss(state, lent) != pytest.approx(float(sum(reclaim_losses(state, lent))))


def test_a_node_with_k_free_gpus_first_then_evict_then_reclaim() -> None:
    # Node 1 has one FREE GPU only; node 2 has two FREE: COLD_FREE on node 2.
    state = layout("T:a T:a F F", "L:a F R:x R:x", "R:x F F L:a", jobs=FITTED)
    assert place(state) == InferencePlacement((2, 1), PlaceAction.COLD_FREE, gpus=((2, 1), (2, 2)))
    # No node with two FREE inference GPUs (the training node's FREE pair is
    # next in ATS-I's order; without the training pool) a node whose sleeping
    # replica completes it: evict the whole 2-GPU replica, use one of its GPUs.
    state = layout("T:a T:a T:a T:a", "L:a F R:x R:x", "R:x F S:y S:y", jobs=FITTED)
    state = _with_replica(state, ((2, 2), (2, 3)))
    out = place(state)
    assert out == InferencePlacement(
        (2, 1), PlaceAction.COLD_EVICT, evicts=((2, 2), (2, 3)), gpus=((2, 1), (2, 2))
    )
    # Only reclaims left: node 1 (FREE + one of a's) rather than node 2 (two of b's).
    state = layout("T:a T:b T:b T:b", "L:a F R:x R:x", "R:x L:b L:b R:x", jobs=FITTED)
    out = place(state)
    assert out is not None and out.action is PlaceAction.COLD_RECLAIM
    assert len({g[0] for g in out.members}) == 1 and len(out.members) == 2


def test_the_reclaim_takes_the_node_whose_set_loses_least() -> None:
    # Node 1: two GPUs of a (a's only GPUs: it stops); node 2: two of b (b keeps 2).
    state = layout("T:b T:b T:b T:b", "L:a L:a R:x R:x", "L:b L:b R:x R:x", jobs=FITTED)
    out = place(state)
    assert out is not None
    losses = {
        node: set_loss(state, [g for g in lent_gpus(state) if g.node_id == node]) for node in (1, 2)
    }
    best = min(losses, key=lambda n: losses[n])
    assert out.gpu[0] == best
    assert [j for _, j in out.reclaims] == ["a" if best == 1 else "b"] * 2


def test_no_node_with_k_gpus_to_spare_leaves_the_task_waiting() -> None:
    state = layout("T:a T:a T:a T:a", "F R:x R:x R:x", "R:x F R:x R:x", jobs=FITTED)
    assert place(state) is None


def test_warm_reuse_takes_the_whole_replica() -> None:
    state = _with_replica(layout("T:a F F F", "F S:s S:s F", jobs=FITTED), ((1, 1), (1, 2)))
    assert place(state) == InferencePlacement((1, 1), PlaceAction.WARM_SLEEP, gpus=((1, 1), (1, 2)))


@pytest.mark.parametrize("name", ["lyra", "random"])
def test_one_gpu_policies_refuse_k_above_one(name: str) -> None:
    state = dataclasses.replace(layout("T:a F F F", "F F F F"), gpus_per_replica=2)
    with pytest.raises(ConfigError, match=f"{name!r} places one-GPU replicas only"):
        create(name).place(state, "s", RNG)


# -- a sleeping server's own GPUs ---------------------------------------------------


def test_a_sleeping_servers_own_gpu_goes_first_in_each_step() -> None:
    # FREE step: (2, 3) over the host-cache node 1 and the fewest-workers order.
    base = layout("T:a F F F", "F F F F", "L:a F F F", jobs=FITTED)
    base = dataclasses.replace(base, host_nodes=frozenset({1}))
    policy = create("ats-i")
    assert policy.place(base, "s", RNG).gpu == (1, 0)  # type: ignore[union-attr]
    own = dataclasses.replace(base, sleeping={(2, 3): "s"})
    assert policy.place(own, "s", RNG).gpu == (2, 3)  # type: ignore[union-attr]
    # Another service's sleeping server changes nothing.
    other = dataclasses.replace(base, sleeping={(2, 3): "t"})
    assert policy.place(other, "s", RNG) == policy.place(base, "s", RNG)
    # Reclaim step: its LENT GPU, whatever the least-loss one is.
    lent = layout("T:a T:a T:b T:b", "L:a L:b L:b L:a", jobs=FITTED)
    plain = policy.place(lent, "s", RNG)
    assert plain is not None and plain.action is PlaceAction.COLD_RECLAIM
    target = next(g.gpu_id for g in lent_gpus(lent) if g.gpu_id != plain.gpu)
    mine = policy.place(dataclasses.replace(lent, sleeping={target: "s"}), "s", RNG)
    assert mine is not None and (mine.gpu, mine.action) == (target, PlaceAction.COLD_RECLAIM)


def test_a_sleeping_servers_own_gpu_set_goes_first_for_k_gpus() -> None:
    state = layout("T:a F F F", "F F F F", "L:a L:a L:b L:b", jobs=FITTED)
    assert place(state).gpus == ((1, 0), (1, 1))  # type: ignore[union-attr]
    # Its server sleeps on (1, 2), (1, 3): that exact set.
    state = dataclasses.replace(state, sleeping={((1, 2), (1, 3)): "s"})
    assert place(state).gpus == ((1, 2), (1, 3))  # type: ignore[union-attr]
    # Its set lent to training: the preference is within a step, and the FREE
    # step comes first, so node 1's FREE GPUs.
    state = dataclasses.replace(state, sleeping={((2, 2), (2, 3)): "s"})
    assert place(state).gpus == ((1, 0), (1, 1))  # type: ignore[union-attr]
    full = layout("T:a T:a T:a T:b", "R:x R:x R:x R:x", "L:a L:a L:b L:b", jobs=FITTED)
    first = place(full)
    assert first is not None and first.action is PlaceAction.COLD_RECLAIM
    other = ((2, 2), (2, 3)) if first.gpus == ((2, 0), (2, 1)) else ((2, 0), (2, 1))
    mine = place(dataclasses.replace(full, sleeping={other: "s"}))
    assert mine is not None and mine.gpus == other


def test_an_empty_sleeping_mapping_changes_nothing() -> None:
    state = layout("T:a T:a T:b F", "L:a L:b S:x F", "P:y L:a F L:b", jobs=FITTED)
    for k in (1, 2):
        st = dataclasses.replace(state, gpus_per_replica=k)
        assert create("ats-i").place(st, "s", RNG) == create("ats-i").place(
            dataclasses.replace(st, sleeping={}), "s", RNG
        )


def _with_replica(state: InferenceState, ids: tuple[tuple[int, int], ...]) -> InferenceState:
    """``state`` with the replica on ``ids`` spanning all of them."""
    gpus = tuple(
        dataclasses.replace(g, replica_gpus=ids) if g.gpu_id in ids else g for g in state.gpus
    )
    return dataclasses.replace(state, gpus=gpus)
