"""The policy registry: names, typed configs, and errors that name what to fix."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest

from deepboot.core import ClusterState, ConfigError, JobMode, UnknownPolicyError
from deepboot.core.placement import Allocation
from deepboot.policies import Packing, registry
from deepboot.policies.lending import LendReserveConfig
from deepboot.policies.lifecycle import LifecycleConfig
from deepboot.policies.registry import PolicyRegistry

BUILT_INS = {
    "fifo": JobMode.FIXED,
    "tiresias": JobMode.FIXED,
    "optimus": JobMode.FIXED_BATCH,
    "pollux": JobMode.ADAPTIVE,
}


def test_the_default_registry_holds_the_built_ins() -> None:
    assert set(BUILT_INS) <= set(registry.names())
    assert registry.names() == sorted(registry.names())


def test_the_built_ins_are_registered_explicitly_into_any_pair_of_registries() -> None:
    """Registries are objects: the built-in list fills a fresh pair (importing the
    policy modules registered nothing into them), and only once."""
    from deepboot.policies.base import TrainingPolicy
    from deepboot.policies.inference.registry import InferenceRegistry

    training: PolicyRegistry[TrainingPolicy] = PolicyRegistry()
    inference = InferenceRegistry()
    assert training.names() == [] and inference.names() == []
    registry.register_builtins(training, inference)
    assert training.names() == sorted(n for n, _, _ in registry.BUILTIN_TRAINING)
    assert inference.names() == ["ats-i", "ats-i-pack", "lyra", "random"]
    assert set(training.names()) <= set(registry.names())  # the default has plug-ins too
    with pytest.raises(ConfigError, match="already registered"):
        registry.register_builtins(training, inference)


@pytest.mark.parametrize("name", sorted(BUILT_INS), ids=sorted(BUILT_INS))
def test_create_builds_the_named_policy_with_defaults(name: str) -> None:
    policy = registry.create(name)
    assert policy.name == name
    assert policy.job_mode is BUILT_INS[name]
    cls = registry.config_class(name)
    assert dataclasses.is_dataclass(cls)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cls(), dataclasses.fields(cls)[0].name, None)


def test_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPolicyError) as err:
        registry.create("lottery")
    message = str(err.value)
    assert "lottery" in message
    for name in BUILT_INS:
        assert name in message
    with pytest.raises(UnknownPolicyError):
        registry.config_class("lottery")


@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("pollux", {"q": -1}, "'q'"),
        ("tiresias", {"threshold": 3}, "'threshold'"),
        ("tiresias", {"queue_threshold_gpu_hours": -1}, "queue_threshold_gpu_hours"),
        ("tiresias", {"queue_threshold_gpu_hours": "many"}, "queue_threshold_gpu_hours"),
        ("pollux", {"restart_delay": 0}, "restart_delay"),
        ("pollux", {"speedup_floor": -1e-3}, "speedup_floor"),
        ("pollux", {"max_nodes_per_job": 0}, "max_nodes_per_job"),
        ("pollux", {"max_nodes_per_job": 2.5}, "max_nodes_per_job"),
        ("pollux", {"p": float("inf")}, "p"),
        ("pollux", {"interference_avoidance": "maybe"}, "interference_avoidance"),
        ("fifo", {"packing": "random"}, "packing"),
        # Accepted before issue 9, and then stopped all scheduling:
        ("pollux", {"p": 1000}, "p"),
        ("pollux", {"restart_delay": "inf"}, "restart_delay"),
        ("pollux", {"restart_delay": 1e9}, "restart_delay"),
        ("deepboot", {"restart_delay": "inf"}, "restart_delay"),
        ("tiresias", {"queue_threshold_gpu_hours": "inf"}, "queue_threshold_gpu_hours"),
    ],
    ids=[
        "unknown-pollux",
        "unknown-tiresias",
        "negative-threshold",
        "non-numeric-threshold",
        "zero-delay",
        "negative-floor",
        "zero-nodes",
        "fractional-int",
        "infinite-p",
        "bad-bool",
        "bad-enum",
        "huge-p",
        "infinite-delay",
        "delay-of-years",
        "deepboot-infinite-delay",
        "infinite-threshold",
    ],
)
def test_bad_parameters_raise_config_error_naming_them(
    name: str, params: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        registry.create(name, **params)
    assert not isinstance(err.value, UnknownPolicyError)
    assert field in str(err.value)


def test_strings_from_a_command_line_are_converted() -> None:
    config = registry.make_config("tiresias", queue_threshold_gpu_hours="8", packing="BEST_FIT")
    assert config.queue_threshold_gpu_hours == 8.0
    assert config.packing is Packing.BEST_FIT
    pollux = registry.make_config("pollux", interference_avoidance="false", max_nodes_per_job="4")
    assert pollux.interference_avoidance is False
    assert pollux.max_nodes_per_job == 4
    policy = registry.create("tiresias", queue_threshold_gpu_hours=2)
    assert policy.config.queue_threshold_gpu_hours == 2.0  # type: ignore[attr-defined]


@dataclass(frozen=True)
class _IdleConfig:
    gpus: int = 0


@dataclass(frozen=True)
class _IdlePolicy:
    config: _IdleConfig
    name: str = "idle"
    job_mode: JobMode = JobMode.FIXED

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        return {}


def test_a_separate_registry_registers_and_rejects_duplicates() -> None:
    reg = PolicyRegistry()
    assert reg.names() == []
    reg.register("idle", _IdlePolicy, _IdleConfig)
    assert reg.names() == ["idle"]
    assert reg.create("idle", gpus="3").config == _IdleConfig(3)  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="already registered"):
        reg.register("idle", _IdlePolicy, _IdleConfig)


def test_configs_must_be_frozen_dataclasses_with_defaults() -> None:
    @dataclass
    class Mutable:
        x: int = 1

    @dataclass(frozen=True)
    class NoDefault:
        x: int

    reg = PolicyRegistry()
    with pytest.raises(ConfigError, match="frozen"):
        reg.register("m", lambda config: _IdlePolicy(_IdleConfig()), Mutable)
    with pytest.raises(ConfigError, match="default"):
        reg.register("n", lambda config: _IdlePolicy(_IdleConfig()), NoDefault)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (lambda: LifecycleConfig(t0=1e9), "t0"),
        (lambda: LifecycleConfig(factor=float("inf")), "factor"),
        (lambda: LendReserveConfig(window_s=float("inf")), "window_s"),
        (lambda: LendReserveConfig(horizon_s=1e12), "horizon_s"),
    ],
    ids=["protect-of-years", "infinite-factor", "infinite-window", "horizon-of-ages"],
)
def test_shared_cluster_settings_have_ranges(config: object, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        config()  # type: ignore[operator]
