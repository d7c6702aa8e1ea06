"""The shared-cluster settings of a run, from the knobs a user names.

One place turns "lending on, AFE, ATS-I random, the reserve at 0.8" into ``SimConfig``
fields, for the command line, the Python API and the benchmarks alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from deepboot.core.errors import ConfigError
from deepboot.perf.restart import AfeRestartCost, FlatRestartCost
from deepboot.policies.lending import LendReserveConfig
from deepboot.policies.lifecycle import LifecycleConfig

MAX_PROTECT_FACTOR = 100.0
"""Largest protect-time factor P (the paper studied 1 and 8)."""


def shared_cluster_config(
    *,
    inference_nodes: int,
    policy: str,
    lending: bool = True,
    lifecycle: bool = True,
    protect_factor: float = 1.0,
    afe: bool | None = None,
    ats_i: str | None = None,
    ats_i_params: Mapping[str, object] | None = None,
    reserve: bool = False,
    reserve_target: float | None = None,
) -> dict[str, Any]:
    """``SimConfig`` keyword arguments for DeepBoot's shared-cluster knobs.

    Args:
        inference_nodes: Nodes in the inference pool (0: a training-only cluster).
        policy: The training policy's name (``lyra`` implies the Lyra-style ATS-I).
        lending: Lend idle inference GPUs to training.
        lifecycle: Keep idle replicas warm (PROTECT) before they sleep.
        protect_factor: The paper's P, multiplying the protect times; in [0, 100].
        afe: AFE's cheap resizes (True), cold restarts for every change (False), or
            the default: AFE when there is an inference pool, else Pollux's flat 30 s.
        ats_i: The inference-placement policy; default ``ats-i`` (``lyra`` for lyra).
        ats_i_params: Its parameters (``deepboot policies`` lists them).
        reserve: The predictive lending reserve (ours, beyond the paper).
        reserve_target: Its coverage Q in [0, 1); default 0.7.

    Raises:
        ConfigError: ``protect_factor`` or ``reserve_target`` is out of range.
    """
    factor = float(protect_factor)
    if not (math.isfinite(factor) and 0.0 <= factor <= MAX_PROTECT_FACTOR):
        raise ConfigError(
            f"protect factor must be in [0, {MAX_PROTECT_FACTOR:g}]; got {protect_factor}"
        )
    if afe is None:
        restart: object = AfeRestartCost(afe=True) if inference_nodes > 0 else FlatRestartCost()
    else:
        restart = AfeRestartCost(afe=bool(afe))
    target = LendReserveConfig().target if reserve_target is None else float(reserve_target)
    if not 0.0 <= target < 1.0:
        raise ConfigError(f"reserve target must be in [0, 1); got {reserve_target}")
    return {
        "lend_reserve": LendReserveConfig(enabled=bool(reserve), target=target),
        "lending": bool(lending),
        "lifecycle": LifecycleConfig(factor=factor, enabled=bool(lifecycle)),
        "restart": restart,
        "inference_policy": ats_i or ("lyra" if policy == "lyra" else "ats-i"),
        "inference_params": MappingProxyType(dict(ats_i_params or {})),
    }
