"""The replica lifecycle: protect time min(t0 + hits * t_bonus, t_max), scaled."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepboot.core import ConfigError, GpuState
from deepboot.policies.lifecycle import (
    LifecycleConfig,
    hits_after_reuse,
    idle_state,
    protect_time,
)

REFERENCE = LifecycleConfig()


@pytest.mark.parametrize(
    ("hits", "cfg", "expected"),
    [
        (0, REFERENCE, 30.0),
        (1, REFERENCE, 45.0),
        (5, REFERENCE, 105.0),
        (6, REFERENCE, 120.0),
        (50, REFERENCE, 120.0),
        (0, LifecycleConfig(factor=8.0), 240.0),
        (6, LifecycleConfig(factor=8.0), 960.0),
        (3, LifecycleConfig(t0=10.0, t_bonus=5.0, t_max=20.0), 20.0),
        (3, LifecycleConfig(enabled=False), 0.0),
    ],
    ids=["none", "one", "five", "at-cap", "past-cap", "p8-none", "p8-cap", "custom", "disabled"],
)
def test_protect_time_table(hits: int, cfg: LifecycleConfig, expected: float) -> None:
    assert protect_time(hits, cfg) == pytest.approx(expected)


@given(
    hits=st.integers(0, 1000),
    t0=st.floats(0, 1e4),
    bonus=st.floats(0, 1e3),
    cap=st.floats(0, 1e4),
    factor=st.floats(0, 16),
)
def test_protect_time_grows_with_hits_and_never_passes_the_scaled_cap(
    hits: int, t0: float, bonus: float, cap: float, factor: float
) -> None:
    cfg = LifecycleConfig(t0=t0, t_bonus=bonus, t_max=cap, factor=factor)
    assert 0.0 <= protect_time(hits, cfg) <= protect_time(hits + 1, cfg) <= factor * cap + 1e-9


@pytest.mark.parametrize(
    ("cfg", "state"),
    [
        (REFERENCE, GpuState.PROTECT),
        (LifecycleConfig(enabled=False), GpuState.SLEEP),
        (LifecycleConfig(factor=0.0), GpuState.SLEEP),
    ],
    ids=["reference", "disabled", "zero-factor"],
)
def test_an_idle_replica_protects_unless_its_protect_time_is_zero(
    cfg: LifecycleConfig, state: GpuState
) -> None:
    assert idle_state(0, cfg) is state


@pytest.mark.parametrize(
    ("state", "hits", "after"),
    [(GpuState.PROTECT, 2, 3), (GpuState.SLEEP, 4, 0)],
    ids=["protect-counts-a-hit", "sleep-resets"],
)
def test_hits_after_warm_reuse(state: GpuState, hits: int, after: int) -> None:
    assert hits_after_reuse(state, hits) == after


@pytest.mark.parametrize(
    "state",
    [s for s in GpuState if s not in (GpuState.PROTECT, GpuState.SLEEP)],
    ids=lambda s: s.name,
)
def test_only_idle_replicas_can_be_reused(state: GpuState) -> None:
    with pytest.raises(ValueError, match=state.name):
        hits_after_reuse(state, 0)


def test_negative_hits_are_rejected() -> None:
    with pytest.raises(ValueError, match="hits"):
        protect_time(-1, REFERENCE)


@pytest.mark.parametrize(
    ("field", "value"),
    [("t0", -1.0), ("t_bonus", float("inf")), ("t_max", float("nan")), ("factor", -0.5)],
    ids=["negative-t0", "infinite-bonus", "nan-max", "negative-factor"],
)
def test_bad_fields_raise_config_error_naming_them(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        LifecycleConfig(**{field: value})  # type: ignore[arg-type]
