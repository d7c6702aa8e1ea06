"""The event-time top-up (``deepboot.policies.topup``): who gets the GPUs free now."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.core.modes import JobMode
from deepboot.policies.topup import TopUpConfig, free_gpus, top_up
from deepboot.scheduler.decision import Decision, Resize, Start, validate_decision
from tests.policies.builders import POOR_PERF, make_job, make_state

CONFIG = TopUpConfig(horizon=60.0, default_cost=10.0)


def test_free_gpus_are_the_capacity_less_what_the_jobs_hold() -> None:
    a = make_job("a", placement=(0, 0, 1))
    state = make_state([a], nodes=3, gpus=4, capacity={0: 4, 1: 1, 2: 2})
    assert free_gpus(state) == {0: 2, 2: 2}


def test_nothing_free_changes_nothing() -> None:
    a = make_job("a", placement=(0, 0, 0, 0))
    assert top_up(make_state([a], nodes=1), JobMode.ADAPTIVE, CONFIG) == {}


def test_queued_jobs_start_oldest_first_on_the_best_fitting_node() -> None:
    # Node 0 has 1 GPU free, node 1 has 3: the oldest queued job takes node 0's
    # (the fewest that hold it), the next one node 1's.
    held = make_job("held", placement=(0, 0, 0, 1), max_replicas=4)
    old = make_job("old", submit_time=1.0, max_replicas=1)
    new = make_job("new", submit_time=2.0, max_replicas=1)
    state = make_state([held, old, new], nodes=2, gpus=4)
    got = top_up(state, JobMode.ADAPTIVE, CONFIG)
    assert got["old"].counts() == {0: 1}
    assert got["new"].counts() == {1: 1}


def test_a_fixed_job_starts_at_its_own_size_and_none_grows() -> None:
    run = make_job("run", placement=(0,), target_num_replicas=1)
    wide = make_job("wide", submit_time=1.0, target_num_replicas=3, max_replicas=3)
    state = make_state([run, wide], nodes=1, gpus=4)
    got = top_up(state, JobMode.FIXED, CONFIG)
    assert set(got) == {"wide"}
    assert got["wide"].num_replicas == 3


def test_a_growth_happens_only_when_its_gain_over_the_horizon_pays_the_pause() -> None:
    # A job without a model scales linearly: 1 -> 2 GPUs doubles its speed.
    a = make_job("a", placement=(0,), max_replicas=2)
    state = make_state([a], nodes=1, gpus=2)
    assert top_up(state, JobMode.ADAPTIVE, CONFIG)["a"].num_replicas == 2
    # (2 - 1) * 15 < 2 * 10: a quarter-minute's gain does not pay two 10 s pauses' worth.
    short = TopUpConfig(horizon=15.0, default_cost=10.0)
    assert top_up(state, JobMode.ADAPTIVE, short) == {}


def test_a_job_that_barely_scales_is_not_grown() -> None:
    a = make_job("a", placement=(0,), perf=POOR_PERF, max_replicas=8)
    state = make_state([a], nodes=2, gpus=4)
    assert "a" not in top_up(state, JobMode.ADAPTIVE, CONFIG)


def test_the_gpus_go_to_the_job_they_help_most_per_gpu() -> None:
    # A 1-GPU job doubles with one more; a 3-GPU job gains a third: the one free GPU
    # goes to the first.
    small = make_job("small", placement=(0,), max_replicas=4)
    large = make_job("large", placement=(1, 1, 1), max_replicas=4)
    state = make_state([small, large], nodes=2, gpus=[2, 3])
    got = top_up(state, JobMode.ADAPTIVE, CONFIG)
    assert got["small"].num_replicas == 2
    assert "large" not in got


def test_a_job_started_now_may_start_larger() -> None:
    a = make_job("a", max_replicas=4)
    got = top_up(make_state([a], nodes=1, gpus=4), JobMode.ADAPTIVE, CONFIG)
    assert got["a"].num_replicas == 4


@st.composite
def _states(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    nodes = draw(st.integers(1, 4))
    gpus = draw(st.lists(st.integers(1, 4), min_size=nodes, max_size=nodes))
    capacity = {n: draw(st.integers(0, g)) for n, g in enumerate(gpus)}
    left = dict(capacity)
    jobs = []
    for i in range(draw(st.integers(0, 6))):
        held: list[int] = []
        for n in range(nodes):
            take = draw(st.integers(0, left[n]))
            left[n] -= take
            held += [n] * take
        jobs.append(
            make_job(
                f"j{i}",
                submit_time=float(i),
                placement=held,
                max_replicas=max(len(held), draw(st.integers(1, 8))),
                fitted=draw(st.booleans()),
                target_num_replicas=draw(st.integers(1, 3)),
            )
        )
    return make_state(jobs, nodes=nodes, gpus=gpus, capacity=capacity)


@settings(max_examples=200, deadline=None)
@given(_states(), st.sampled_from(list(JobMode)))
def test_a_top_up_only_adds_free_gpus_and_passes_validation(state, mode) -> None:  # type: ignore[no-untyped-def]
    free = free_gpus(state)
    got = top_up(state, mode, CONFIG)
    views = {j.name: j for j in state.jobs}
    added: Counter[int] = Counter()
    for name, new in got.items():
        old = views[name].placement
        grown = Counter(new.node_ids)
        grown.subtract(old.node_ids)
        assert all(v >= 0 for v in grown.values()), "a top-up never shrinks or moves a job"
        assert new.num_replicas > old.num_replicas
        added.update(+grown)
    assert all(added[n] <= free.get(n, 0) for n in added)
    ops = [
        Resize(n, views[n].placement, p) if views[n].placement else Start(n, p)
        for n, p in got.items()
    ]
    validate_decision(Decision(tuple(ops)), state)
