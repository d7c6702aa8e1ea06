"""The control loop: operations diffed from a policy's allocation, validated first."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.core import (
    BatchLimits,
    ClusterSpec,
    ClusterState,
    InvalidDecisionError,
    JobMode,
    JobView,
    Placement,
)
from deepboot.core.placement import Allocation, freeze_allocation
from deepboot.scheduler import (
    Decision,
    Event,
    EventKind,
    Preempt,
    Resize,
    Scheduler,
    Start,
    resulting_allocation,
    validate_decision,
)

LIMITS = BatchLimits(init_batch_size=32, max_batch_size=1024, min_local_bsz=16, max_local_bsz=64)


def make_job(name: str, placement: tuple[int, ...] = (), max_replicas: int = 8) -> JobView:
    return JobView(
        name=name,
        application="toy",
        submit_time=0.0,
        attained_service=0.0,
        num_restarts=0,
        placement=Placement.of(placement),
        min_replicas=0,
        max_replicas=max_replicas,
        limits=LIMITS,
    )


def make_state(
    *jobs: JobView, shape: str = "2x4", capacity: Mapping[int, int] | None = None
) -> ClusterState:
    cluster = ClusterSpec.parse(shape)
    if capacity is None:
        return ClusterState.training_view(100.0, cluster, jobs)
    return ClusterState(100.0, cluster, jobs, capacity)


@dataclass(frozen=True)
class FixedAllocation:
    """A policy that returns a fixed allocation, whatever the state."""

    alloc: Mapping[str, tuple[int, ...]]
    name: str = "fixed-alloc"
    job_mode: JobMode = JobMode.FIXED

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        return freeze_allocation({k: Placement.of(v) for k, v in self.alloc.items()})


def decide(state: ClusterState, alloc: Mapping[str, tuple[int, ...]]) -> Decision:
    return Scheduler(FixedAllocation(alloc)).decide(state, np.random.default_rng(0))


def test_decide_diffs_against_current_placements() -> None:
    state = make_state(
        make_job("a", (0, 0)),
        make_job("b"),
        make_job("c", (1,)),
        make_job("d", (1, 1)),
    )
    decision = decide(state, {"a": (0, 0), "b": (0, 1), "d": (1, 1, 1)})
    assert decision.ops == (
        Start("b", Placement((0, 1))),
        Preempt("c", Placement((1,))),
        Resize("d", Placement((1, 1)), Placement((1, 1, 1))),
    )
    assert resulting_allocation(decision, state) == {
        "a": Placement((0, 0)),
        "b": Placement((0, 1)),
        "d": Placement((1, 1, 1)),
    }


def test_unchanged_allocation_gives_empty_decision() -> None:
    state = make_state(make_job("a", (0,)), make_job("b"))
    decision = decide(state, {"a": (0,)})
    assert not decision
    assert len(decision) == 0


Case = tuple[Callable[[], ClusterState], Mapping[str, tuple[int, ...]], str]

REJECTED: list[Case] = [
    (lambda: make_state(make_job("a"), make_job("b")), {"a": (0,) * 3, "b": (0,) * 2}, "double"),
    (
        lambda: make_state(make_job("a", (0,) * 4), make_job("b")),
        {"a": (0,) * 4, "b": (0,)},
        "double",
    ),
    (
        lambda: make_state(make_job("a"), capacity={0: 2, 1: 4}),
        {"a": (0, 0, 0)},
        "capacity",
    ),
    (lambda: make_state(make_job("a")), {"ghost": (0,)}, "unknown"),
    (lambda: make_state(make_job("a")), {"a": (7,)}, "outside"),
    (lambda: make_state(make_job("a", max_replicas=2)), {"a": (0, 0, 1)}, "max_replicas"),
]


@pytest.mark.parametrize(
    ("make", "alloc", "words"),
    REJECTED,
    ids=["double-book-new", "double-book-kept", "over-capacity", "unknown-job", "bad-node", "max"],
)
def test_scheduler_rejects_invalid_allocations(
    make: Callable[[], ClusterState], alloc: Mapping[str, tuple[int, ...]], words: str
) -> None:
    state = make()
    before = {j.name: j.placement for j in state.jobs}
    with pytest.raises(InvalidDecisionError, match=words):
        decide(state, alloc)
    # Nothing is applied: the snapshot is immutable and still says what it said.
    assert {j.name: j.placement for j in state.jobs} == before


BAD_DECISIONS: list[tuple[Decision, str]] = [
    (Decision((Start("a", Placement((0,))), Start("a", Placement((1,))))), "more than one"),
    (Decision((Start("b", Placement((1,))),)), "expects placement"),
    (Decision((Resize("b", Placement((1,)), Placement((1, 1))),)), "expects placement"),
    (Decision((Preempt("a", Placement((0,))),)), "expects placement"),
    (Decision((Resize("b", Placement((0,)), Placement((0,))),)), "same placement"),
    (Decision((Start("a", Placement(())),)), "no GPU"),
    (Decision((Resize("b", Placement((0,)), Placement(())),)), "no GPU"),
]


@pytest.mark.parametrize(
    ("decision", "words"),
    BAD_DECISIONS,
    ids=[
        "twice",
        "start-running",
        "stale-old",
        "preempt-queued",
        "noop-resize",
        "start-empty",
        "resize-empty",
    ],
)
def test_validate_decision_rejects_malformed_operations(decision: Decision, words: str) -> None:
    state = make_state(make_job("a"), make_job("b", (0,)))
    with pytest.raises(InvalidDecisionError, match=words):
        validate_decision(decision, state)


def test_validation_counts_gpus_freed_in_the_same_decision() -> None:
    # b moves off node 0 while a takes all of node 0: valid as a whole.
    state = make_state(make_job("a"), make_job("b", (0, 0)))
    decision = decide(state, {"a": (0, 0, 0, 0), "b": (1, 1)})
    assert resulting_allocation(decision, state)["a"] == Placement((0, 0, 0, 0))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=5), min_size=1, max_size=4),
    st.lists(st.integers(0, 4), min_size=3, max_size=3),
)
def test_decision_valid_iff_within_capacity(requests: list[list[int]], capacity: list[int]) -> None:
    jobs = tuple(make_job(f"j{i}") for i in range(len(requests)))
    state = make_state(*jobs, shape="3x4", capacity=dict(enumerate(capacity)))
    alloc = {f"j{i}": tuple(r) for i, r in enumerate(requests) if r}
    used = [0, 0, 0]
    for r in requests:
        for n in r:
            used[n] += 1
    fits = all(u <= c for u, c in zip(used, capacity, strict=True))
    if fits:
        decision = decide(state, alloc)
        assert resulting_allocation(decision, state) == {
            k: Placement.of(v) for k, v in alloc.items()
        }
    else:
        with pytest.raises(InvalidDecisionError):
            decide(state, alloc)


@pytest.mark.parametrize("kind", list(EventKind), ids=[k.name for k in EventKind])
def test_every_event_kind_has_a_priority(kind: EventKind) -> None:
    assert isinstance(kind.priority, int)
    assert Event(kind).kind is kind


def test_event_priorities_are_distinct_and_tick_runs_last() -> None:
    prios = [k.priority for k in EventKind]
    assert len(set(prios)) == len(prios)
    assert EventKind.JOB_FINISHED.priority < EventKind.JOB_SUBMITTED.priority
    assert EventKind.TICK.priority == max(prios)
