"""The shared-cluster settings of a run, from the knobs a user names.

One place turns "lending on, AFE, ATS-I random, the reserve at 0.8" into ``SimConfig``
fields, for the command line, the Python API and the benchmarks alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from deepboot.core.errors import ConfigError
from deepboot.perf.restart import AfeRestartCost, FlatRestartCost
from deepboot.policies.lending import LendReserveConfig
from deepboot.policies.lifecycle import LifecycleConfig
from deepboot.policies.slo import SloConfig

SLO_REFERENCES = ("warm-pool", "oracle")
"""The two references SLO-guarded lending is held against (``SimConfig.slo_reference``)."""

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
    slo: bool = False,
    slo_target: float | None = None,
    slo_horizon: float | None = None,
    slo_idle: float | None = None,
    warm_pool: bool = False,
    oracle: bool = False,
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
        slo: SLO-guarded lending (docs/slo.md): hold each service's forecast need,
            pre-warm ahead of demand, reclaim proactively. Replaces the reserve.
        slo_target: Overrides every service's ``slo_target`` (with ``slo``,
            ``warm_pool`` or ``oracle``).
        slo_horizon: The forecast horizon's minimum, seconds (with ``slo``).
        slo_idle: With ``slo``: the fraction of the relaxed services' cold starts
            that find an idle GPU rather than wait on a reclaim, in (0, 1) (None:
            ``SloConfig.idle_target``, 0.75).
        warm_pool: The non-clairvoyant reference: each service's Erlang-B replicas
            at its true mean load held as ``guaranteed_replicas``, the rest as
            DeepBoot.
        oracle: The clairvoyant reference: SLO-guarded lending holding each
            service's exact future demand instead of a forecast.

    Raises:
        ConfigError: ``protect_factor``, ``reserve_target``, ``slo_target`` or
            ``slo_horizon`` is out of range; two of ``slo``, ``warm_pool``,
            ``oracle`` and ``reserve`` are on; one of the first three without lending.
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
    chosen = [n for n, on in (("slo", slo), ("warm-pool", warm_pool), ("oracle", oracle)) if on]
    if len(chosen) + bool(reserve) > 1:
        both = " and ".join(f"--{n}" for n in [*chosen, *(["reserve"] if reserve else [])])
        raise ConfigError(
            f"{both}: pick one (--slo replaces the reserve; --warm-pool and --oracle are "
            "references to hold --slo against)"
        )
    if chosen and not lending:
        raise ConfigError(f"--{chosen[0]} decides what is lent: it needs lending on")
    if (slo_target is not None or slo_horizon is not None) and not chosen:
        raise ConfigError("--slo-target and --slo-horizon need --slo, --warm-pool or --oracle")
    if slo_horizon is not None and not slo:
        raise ConfigError("--slo-horizon needs --slo (the references have no forecast)")
    if slo_idle is not None and not slo:
        raise ConfigError("--slo-idle needs --slo (the references hold no idle pool)")
    if slo_idle is not None and not 0.0 < float(slo_idle) < 1.0:
        raise ConfigError(f"--slo-idle must be in (0, 1); got {slo_idle}")
    slo_config = SloConfig(
        enabled=bool(slo or oracle),
        target=None if slo_target is None else float(slo_target),
        horizon_s=None if slo_horizon is None else float(slo_horizon),
    )
    if slo_idle is not None:
        slo_config = dataclasses.replace(slo_config, idle_target=float(slo_idle))
    return {
        "slo": slo_config,
        "slo_reference": chosen[0] if chosen and chosen[0] != "slo" else "",
        "lend_reserve": LendReserveConfig(enabled=bool(reserve), target=target),
        "lending": bool(lending),
        "lifecycle": LifecycleConfig(factor=factor, enabled=bool(lifecycle)),
        "restart": restart,
        "inference_policy": ats_i or ("lyra" if policy == "lyra" else "ats-i"),
        "inference_params": MappingProxyType(dict(ats_i_params or {})),
    }
