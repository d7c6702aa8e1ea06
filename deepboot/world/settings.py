"""The shared-cluster configuration of a run, typed, from the knobs a user names.

:class:`SharedCluster` holds "lending on, AFE, ATS-I random, the reserve at 0.8" as
the user said it (validated once, whichever door it came in by: the command line,
the Python API, the run matrix or ``deepboot up``); the simulator takes its
``SimConfig`` fields from it (:meth:`SharedCluster.sim_kwargs`), and both worlds turn
it into the control loop's settings with one function (:func:`loop_settings`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from deepboot.core.errors import ConfigError
from deepboot.perf.restart import AfeRestartCost, FlatRestartCost
from deepboot.policies.lending import LendReserveConfig
from deepboot.policies.lifecycle import LifecycleConfig
from deepboot.policies.slo import SloConfig, paced
from deepboot.scheduler.control import LoopSettings
from deepboot.world.hostcache import HostCacheConfig

SLO_REFERENCES = ("warm-pool", "oracle")
"""The two references SLO-guarded lending is held against (``SimConfig.slo_reference``)."""

MAX_PROTECT_FACTOR = 100.0
"""Largest protect-time factor P (the paper studied 1 and 8)."""


def _no_params() -> Mapping[str, object]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SharedCluster:
    """DeepBoot's shared-cluster knobs, as a user names them; checked when made.

    Attributes:
        lending: Lend idle inference GPUs to training.
        lifecycle: Keep idle replicas warm (PROTECT) before they sleep.
        protect_factor: The paper's P, multiplying the protect times; in [0, 100].
        afe: AFE's cheap resizes (True), cold restarts for every change (False), or
            the default: AFE when there is an inference pool, else Pollux's flat 30 s
            (the runtime: keep-alive resizes).
        ats_i: The inference-placement policy; default ``ats-i`` (``lyra`` for lyra).
        ats_i_params: Its parameters (``deepboot policies`` lists them).
        reserve: The predictive lending reserve (ours, beyond the paper).
        reserve_target: Its coverage Q in [0, 1); default 0.7.
        reserve_window: Seconds of history its rates and run times are measured
            over (default 600).
        slo: SLO-guarded lending (docs/slo.md): hold each service's forecast need,
            pre-warm ahead of demand, reclaim proactively. Replaces the reserve.
        slo_target: Overrides every service's ``slo_target`` (with ``slo``,
            ``warm_pool`` or ``oracle``).
        slo_horizon: The forecast horizon's minimum, seconds (with ``slo``).
        slo_poisson: With ``slo``: size as if arrivals were Poisson (the sizing before
            issue 45; for comparison), not for their measured burstiness.
        slo_idle: With ``slo``: the fraction of the relaxed services' cold starts
            that find an idle GPU rather than wait on a reclaim, in (0, 1) (None:
            ``SloConfig.idle_target``, 0.75).
        warm_pool: The non-clairvoyant reference: each service's Erlang-B replicas
            at its true mean load held as ``guaranteed_replicas``, the rest as
            DeepBoot.
        oracle: The clairvoyant reference: SLO-guarded lending holding each
            service's exact future demand instead of a forecast.
        host_cache_gb: GB of host memory per inference node that keeps the models
            of evicted replicas (:mod:`deepboot.world.hostcache`); 0 = off.
        host_gbps: Its host-to-GPU copy bandwidth, GB/s (None: the default).
        host_init_s: The fixed seconds of a start from it (None: the default).
        host_cache_preload: Stage every service's model in the caches before the
            first request (:attr:`HostCacheConfig.preload`; the simulator's only).
        event_lending: Hand out GPUs freed between rounds at once, at the event
            that frees them (``LoopSettings.event_lending``), not at the next round.

    Raises:
        ConfigError: ``protect_factor``, ``reserve_target``, ``reserve_window``,
            ``slo_target``, ``slo_horizon`` or ``slo_idle`` is out of range; two of
            ``slo``, ``warm_pool``, ``oracle`` and ``reserve`` are on; one of the
            first three without lending.
    """

    lending: bool = True
    lifecycle: bool = True
    protect_factor: float = 1.0
    afe: bool | None = None
    ats_i: str | None = None
    ats_i_params: Mapping[str, object] = field(default_factory=_no_params)
    reserve: bool = False
    reserve_target: float | None = None
    reserve_window: float | None = None
    slo: bool = False
    slo_target: float | None = None
    slo_horizon: float | None = None
    slo_idle: float | None = None
    slo_poisson: bool = False
    warm_pool: bool = False
    oracle: bool = False
    host_cache_gb: float = 0.0
    host_gbps: float | None = None
    host_init_s: float | None = None
    host_cache_preload: bool = False
    event_lending: bool = False

    def __post_init__(self) -> None:
        # Numbers as numbers, whichever door they came in by (a matrix cell, JSON).
        for name in ("protect_factor", "reserve_target", "reserve_window", "slo_target",
                     "slo_horizon", "slo_idle", "host_cache_gb", "host_gbps",
                     "host_init_s"):  # fmt: skip
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, float(value))
        object.__setattr__(self, "ats_i_params", MappingProxyType(dict(self.ats_i_params or {})))
        factor = self.protect_factor
        if not (math.isfinite(factor) and 0.0 <= factor <= MAX_PROTECT_FACTOR):
            raise ConfigError(
                f"protect factor must be in [0, {MAX_PROTECT_FACTOR:g}]; got {factor}"
            )
        target = self.reserve_target
        if target is not None and not 0.0 <= target < 1.0:
            raise ConfigError(f"reserve target must be in [0, 1); got {target}")
        self.lend_reserve  # noqa: B018 - LendReserveConfig checks the window
        chosen = self._chosen()
        reserve = self.reserve
        if len(chosen) + bool(reserve) > 1:
            both = " and ".join(f"--{n}" for n in [*chosen, *(["reserve"] if reserve else [])])
            raise ConfigError(
                f"{both}: pick one (--slo replaces the reserve; --warm-pool and --oracle are "
                "references to hold --slo against)"
            )
        if chosen and not self.lending:
            raise ConfigError(f"--{chosen[0]} decides what is lent: it needs lending on")
        if (self.slo_target is not None or self.slo_horizon is not None) and not chosen:
            raise ConfigError("--slo-target and --slo-horizon need --slo, --warm-pool or --oracle")
        if self.slo_horizon is not None and not self.slo:
            raise ConfigError("--slo-horizon needs --slo (the references have no forecast)")
        if self.slo_poisson and not self.slo:
            raise ConfigError("--slo-poisson needs --slo (it changes the guard's sizing)")
        if self.slo_idle is not None and not self.slo:
            raise ConfigError("--slo-idle needs --slo (the references hold no idle pool)")
        if self.slo_idle is not None and not 0.0 < self.slo_idle < 1.0:
            raise ConfigError(f"--slo-idle must be in (0, 1); got {self.slo_idle}")
        self.slo_config  # noqa: B018 - SloConfig checks the target and the horizon
        if (self.host_gbps is not None or self.host_init_s is not None) and not (
            self.host_cache_gb
        ):
            raise ConfigError("--host-gbps and --host-init-s need --host-cache-gb")
        if self.host_cache_preload and not self.host_cache_gb:
            raise ConfigError("--host-cache-preload needs --host-cache-gb")
        self.host_cache  # noqa: B018 - HostCacheConfig checks the three

    def _chosen(self) -> list[str]:
        pairs = (("slo", self.slo), ("warm-pool", self.warm_pool), ("oracle", self.oracle))
        return [n for n, on in pairs if on]

    @property
    def lend_reserve(self) -> LendReserveConfig:
        """The predictive lending reserve's configuration."""
        default = LendReserveConfig()
        return LendReserveConfig(
            enabled=bool(self.reserve),
            target=default.target if self.reserve_target is None else self.reserve_target,
            window_s=default.window_s if self.reserve_window is None else self.reserve_window,
        )

    @property
    def lifecycle_config(self) -> LifecycleConfig:
        """The protect-time rule of idle replicas."""
        return LifecycleConfig(factor=self.protect_factor, enabled=bool(self.lifecycle))

    @property
    def slo_config(self) -> SloConfig:
        """SLO-guarded lending's configuration (on with ``slo`` or ``oracle``)."""
        cfg = SloConfig(
            enabled=bool(self.slo or self.oracle),
            target=self.slo_target,
            horizon_s=self.slo_horizon,
        )
        if self.slo_idle is not None:
            cfg = dataclasses.replace(cfg, idle_target=self.slo_idle)
        if self.slo_poisson:
            cfg = dataclasses.replace(cfg, burst_sizing=False)
        return cfg

    @property
    def host_cache(self) -> HostCacheConfig:
        """The host-memory model cache of each inference node (off at 0 GB)."""
        default = HostCacheConfig()
        return HostCacheConfig(
            capacity_gb=self.host_cache_gb,
            gbps=default.gbps if self.host_gbps is None else self.host_gbps,
            init_s=default.init_s if self.host_init_s is None else self.host_init_s,
            preload=bool(self.host_cache_preload),
        )

    @property
    def slo_reference(self) -> str:
        """``warm-pool``, ``oracle``, or empty (no reference)."""
        chosen = self._chosen()
        return chosen[0] if chosen and chosen[0] != "slo" else ""

    def inference_policy(self, policy: str) -> str:
        """The inference-placement policy for training policy ``policy``."""
        return self.ats_i or ("lyra" if policy == "lyra" else "ats-i")

    def sim_kwargs(self, *, inference_nodes: int, policy: str) -> dict[str, Any]:
        """``SimConfig`` keyword arguments for these knobs.

        Args:
            inference_nodes: Nodes in the inference pool (0: a training-only cluster;
                the default restart costs depend on it).
            policy: The training policy's name (``lyra`` implies the Lyra-style ATS-I).
        """
        if self.afe is None:
            restart: object = AfeRestartCost(afe=True) if inference_nodes > 0 else FlatRestartCost()
        else:
            restart = AfeRestartCost(afe=bool(self.afe))
        return {
            "slo": self.slo_config,
            "slo_reference": self.slo_reference,
            "lend_reserve": self.lend_reserve,
            "lending": bool(self.lending),
            "lifecycle": self.lifecycle_config,
            "restart": restart,
            "inference_policy": self.inference_policy(policy),
            "inference_params": MappingProxyType(dict(self.ats_i_params)),
            "host_cache": self.host_cache,
            "event_lending": bool(self.event_lending),
        }

    def to_dict(self) -> dict[str, Any]:
        """The knobs as JSON-ready values (``deepboot up`` saves them)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["ats_i_params"] = dict(self.ats_i_params)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SharedCluster:
        """The knobs :meth:`to_dict` wrote (unknown keys refused, by name).

        Raises:
            ConfigError: an unknown key, or a value out of range.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown shared-cluster settings: {', '.join(unknown)}")
        values = dict(raw)
        values["ats_i_params"] = MappingProxyType(dict(values.get("ats_i_params") or {}))
        return cls(**values)


def loop_settings(
    interval: float,
    *,
    lending: bool,
    lifecycle: LifecycleConfig,
    reserve: LendReserveConfig,
    slo: SloConfig,
    event_lending: bool = False,
) -> LoopSettings:
    """The control loop's settings, in both worlds (the one place they are made).

    The SLO guard runs only where training may borrow: without lending its
    configuration is dropped (there is nothing to guard). Its forecast ticks at the
    loop's pace (:func:`deepboot.policies.slo.paced`).
    """
    return LoopSettings(
        interval=interval,
        lending=lending,
        lifecycle=lifecycle,
        reserve=reserve,
        slo=paced(slo, interval) if lending else SloConfig(),
        event_lending=event_lending,
    )


def shared_loop_settings(shared: SharedCluster, interval: float) -> LoopSettings:
    """:func:`loop_settings` for the knobs of ``shared`` (the runtime's)."""
    return loop_settings(
        interval,
        lending=shared.lending,
        lifecycle=shared.lifecycle_config,
        reserve=shared.lend_reserve,
        slo=shared.slo_config,
        event_lending=shared.event_lending,
    )
