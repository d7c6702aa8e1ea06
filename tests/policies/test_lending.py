"""The predictive lending reserve (``deepboot.policies.lending``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from deepboot.core import GpuState, Pool
from deepboot.core.errors import ConfigError
from deepboot.core.gpu import GpuView
from deepboot.policies.lending import (
    LendReserveConfig,
    ServiceLoad,
    poisson_quantile,
    replicas_needed,
    reserved_gpus,
)

ON = LendReserveConfig(enabled=True, target=0.8)


def gpu(node: int, index: int, state: GpuState, service: str | None = None) -> GpuView:
    pool = Pool.INFERENCE if node >= 1 else Pool.TRAINING
    return GpuView(node, index, pool, state, service=service)


@given(st.floats(0.0, 40.0), st.floats(0.0, 0.999))
def test_poisson_quantile_matches_scipy(mean: float, target: float) -> None:
    n = poisson_quantile(mean, target)
    if mean == 0.0:
        assert n == 0
        return
    # The smallest n whose CDF reaches the target (scipy's ppf, up to rounding at the
    # boundary: the CDF at n reaches it and the CDF at n - 1 does not, to 1e-9).
    assert stats.poisson.cdf(n, mean) >= target - 1e-9
    if n > 0:
        assert stats.poisson.cdf(n - 1, mean) < target + 1e-9


def test_poisson_quantile_rejects_bad_targets() -> None:
    with pytest.raises(ValueError, match="target"):
        poisson_quantile(1.0, 1.0)
    with pytest.raises(ValueError, match="mean"):
        poisson_quantile(math.inf, 0.5)


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("target", {"target": 1.0}),
        ("window_s", {"window_s": 0.0}),
        ("horizon_s", {"horizon_s": -1.0}),
    ],
)
def test_config_names_the_bad_field(field: str, kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=field):
        LendReserveConfig(enabled=True, **kwargs)  # type: ignore[arg-type]


def load(rate: float, duration_s: float = 5.0) -> ServiceLoad:
    return ServiceLoad(rate, duration_s)


def test_replicas_needed_follows_the_concurrency_an_arrival_sees() -> None:
    # One arrival in ten minutes: P[none in 60 s] = e^-0.1 = 0.90 >= 0.8: quiet.
    assert replicas_needed(load(1 / 600), 60.0, 0.8) == 0
    # One a minute of 5 s tasks: mean 1/12 running, P[0] = 0.92 >= 0.8: one replica.
    assert replicas_needed(load(1 / 60), 60.0, 0.8) == 1
    # Mean 1 running: P[<= 1] = 0.74 < 0.8 <= P[<= 2] = 0.92: two busy, one more.
    assert replicas_needed(load(1 / 5), 60.0, 0.8) == 3
    assert replicas_needed(load(0.0), 60.0, 0.8) == 0


@pytest.mark.parametrize(
    ("concurrency", "replicas"), [(1, 3), (2, 2), (3, 1), (8, 1)], ids=["c1", "c2", "c3", "c8"]
)
def test_replicas_with_several_slots_hold_several_tasks(concurrency: int, replicas: int) -> None:
    # Three tasks to have room for (two in flight at the 0.8 quantile, and the next).
    assert replicas_needed(load(1 / 5), 60.0, 0.8, concurrency) == replicas


def test_the_reserve_counts_slots_not_tasks() -> None:
    """Azure-like load (14.6 tasks in flight) on replicas of 8 slots, one of them
    RUNNING: the reserve keeps 2 more, not all 7 idle GPUs."""
    gpus = [gpu(1, 0, GpuState.RUNNING, "a")] + [
        gpu(1 + i // 4, i % 4, GpuState.FREE) for i in range(1, 8)
    ]
    kept = reserved_gpus(
        gpus, {"a": load(5.4, 2.7)}, 60.0, LendReserveConfig(enabled=True, target=0.9), {"a": 8}
    )
    assert len(kept) == 2
    every = reserved_gpus(
        gpus, {"a": load(5.4, 2.7)}, 60.0, LendReserveConfig(enabled=True, target=0.9)
    )
    assert len(every) == 7


def test_disabled_or_quiet_services_keep_nothing() -> None:
    gpus = [gpu(1, 0, GpuState.SLEEP, "a"), gpu(1, 1, GpuState.FREE)]
    assert reserved_gpus(gpus, {"a": load(1.0)}, 60.0, LendReserveConfig()) == frozenset()
    assert reserved_gpus(gpus, {"a": load(1 / 600)}, 60.0, ON) == frozenset()
    assert reserved_gpus(gpus, {}, 60.0, ON) == frozenset()


def test_busy_service_keeps_its_sleep_replicas_not_others() -> None:
    gpus = [
        gpu(0, 0, GpuState.FREE),  # training pool: never kept
        gpu(1, 0, GpuState.SLEEP, "b"),
        gpu(1, 1, GpuState.SLEEP, "a"),
        gpu(1, 2, GpuState.SLEEP, "a"),
        gpu(1, 3, GpuState.SLEEP, "a"),
        gpu(2, 0, GpuState.FREE),
    ]
    # Three replicas needed (see above); "b" is quiet.
    busy_a = {"a": load(1 / 5), "b": load(1 / 600)}
    assert reserved_gpus(gpus, busy_a, 60.0, ON) == {(1, 1), (1, 2), (1, 3)}
    # Replicas already RUNNING or PROTECT count towards the three.
    more = [*gpus, gpu(2, 1, GpuState.PROTECT, "a"), gpu(2, 2, GpuState.RUNNING, "a")]
    assert reserved_gpus(more, busy_a, 60.0, ON) == {(1, 1)}


def test_a_service_without_replicas_keeps_free_gpus() -> None:
    gpus = [gpu(1, 0, GpuState.SLEEP, "b"), gpu(1, 1, GpuState.FREE), gpu(1, 2, GpuState.FREE)]
    assert reserved_gpus(gpus, {"a": load(1 / 60)}, 60.0, ON) == {(1, 1)}
    # The config's own horizon overrides the interval: P[none in 6 s] = 0.9, quiet.
    short = LendReserveConfig(enabled=True, target=0.8, horizon_s=6.0)
    assert reserved_gpus(gpus, {"a": load(1 / 60)}, 60.0, short) == frozenset()


def test_never_more_than_the_idle_gpus() -> None:
    gpus = [gpu(1, 0, GpuState.FREE), gpu(1, 1, GpuState.LENT), gpu(1, 2, GpuState.RUNNING, "x")]
    kept = reserved_gpus(gpus, {"a": load(1.0), "b": load(1.0)}, 60.0, ON)
    assert kept == {(1, 0)}
