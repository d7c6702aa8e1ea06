"""Typed configuration of one simulation run (no module-level knobs)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from deepboot.core.errors import ConfigError
from deepboot.perf.restart import FlatRestartCost, RestartCostModel
from deepboot.policies.lending import LendReserveConfig
from deepboot.policies.lifecycle import LifecycleConfig
from deepboot.policies.slo import SloConfig
from deepboot.world.hostcache import MODEL_GB, HostCacheConfig

_T = TypeVar("_T", int, float)


def _frozen(d: Mapping[str, _T]) -> Mapping[str, _T]:
    return MappingProxyType(dict(d))


DEEPBOOT_COLD_START: Mapping[str, float] = MappingProxyType(
    {
        "bert": 8.0,
        "cifar10": 6.0,
        "imagenet": 6.0,
        "yolov3": 6.0,
        "deepspeech2": 4.0,
        "ncf": 4.0,
    }
)
"""Start-up seconds of an inference replica per model (the DeepBoot artifact's
``APPLICATIONS_DELAY['infer-<model>']``)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Settings of one simulation. Defaults are the Pollux reference settings.

    Attributes:
        interval: Seconds between scheduling ticks; ticks run at k * interval, k >= 1
            (the reference first schedules at ``interval``, not at 0).
        seed: Seed of the ``numpy.random.Generator`` handed to the policy.
        restart: Delay model charged on every placement change, the first start
            included (reference: a flat 30 s); each job applies it by its resize
            mode (:func:`~deepboot.perf.restart.job_restart_delay`: a
            ``resize="restart"`` job pays a full start on every change).
        max_time: Stop the simulation at this virtual time (None: run until every
            job completes). Jobs unfinished then have no completion time.
        replica_cap: Cap on an ADAPTIVE job's ``max_replicas`` (reference 64).
        adaptive_batch_size: Applications whose total batch stays fixed even under
            an ADAPTIVE policy (reference: ncf at 32768).
        app_max_replicas: Per-application cap on ``max_replicas`` under ADAPTIVE
            and FIXED_BATCH policies (reference: ncf at 1; FIXED jobs keep the
            replicas they asked for).
        round_epoch_times: Round each epoch-crossing interval to whole seconds, as the
            reference simulator does. Off by default: epoch and completion times are
            exact.
        inference_params: Parameters of the inference-placement policy (its config's
            fields; strings are converted as for training policies).
        inference_policy: Registry name of the inference-placement policy run on
            every inference arrival (``deepboot.policies.inference``): ``ats-i``,
            ``random`` or ``lyra``.
        lending: Lend idle (FREE, SLEEP) inference-pool GPUs to training at each
            tick, and let inference reclaim them. Off: training sees only the
            training pool and inference never reclaims (the training-pool-only
            baseline).
        lifecycle: Protect-time rule of idle replicas (RUNNING -> PROTECT -> SLEEP).
        lend_reserve: Predictive lending: idle replicas kept back from each training
            round for the arrivals the recent rates predict (off: DeepBoot's rule,
            lend every FREE and SLEEP inference GPU).
        slo: SLO-guarded lending (:mod:`deepboot.policies.slo`); its ``oracle``
            schedules are filled by the simulation for ``slo_reference = "oracle"``.
        slo_reference: "" (none), "warm-pool" (each service's Erlang-B replicas at
            its true mean load held as ``guaranteed_replicas``) or "oracle" (``slo``
            with each service's exact future demand): set by the simulation from the
            workload it runs.
        cold_start: Start-up seconds of a new replica, per model.
        cold_start_default: Start-up seconds of a model missing from ``cold_start``.
        host_cache: Each inference node's host-memory model cache
            (:mod:`deepboot.world.hostcache`; off by default: every start is cold).
        event_lending: Hand out GPUs freed between ticks at the event that frees
            them (``LoopSettings.event_lending``; off: the reference's ticks only).
        model_gb: Weights of each model, GB, for the host cache (a service's own
            ``model_gb`` wins); a model in neither is refused when the cache is on.
        job_bounds: How many GPUs a policy may give a job: "reference" (the
            reference simulator's rules: from 0, and ADAPTIVE jobs at most twice the
            most GPUs they ran on) or "runtime" (as the runtime bounds its jobs: at
            least 1, up to ``app_max_replicas`` at once, and no size change while a
            resize's cost is paid; for a twin of a runtime run, ``bench/twin.py``).
        grad_min_replicas: Fewest GPUs a job must have run on before a policy sees its
            gradient statistics (until then its speedup is linear, as for any job
            without a model): 1 (the reference: known from the first step) or 2 (the
            runtime, whose gradient-noise estimator compares ranks; ``bench/twin.py``).
        profile_steps: Optimizer steps a job must run on a configuration (after its
            restart delay) before a policy sees that configuration's step time: 0 (the
            reference: known at once, however short the run) or more (the runtime
            times a generation's steps from its second one, so 2; ``bench/twin.py``).
        check_invariants: Re-check every GPU-state invariant after every event
            (a debug hook for the property tests; O(GPUs) per event).
        slowdowns: Model name -> how many times slower than its profile a job of it
            progresses (>= 1; absent: 1). Sia's simulator divides every job's goodput
            so (:data:`~deepboot.perf.restart.SIA_SLOWDOWNS`), to match its testbed.
        model_per_type: On a cluster of several GPU types, each job keeps one profile
            and fitted model per type (True), or one for all types (False: the job's
            measurements on one type stand for every type, as Sia's simulator runs
            its heterogeneity-unaware Pollux baseline).
        stall_ticks: Consecutive ticks with jobs waiting, no job holding a GPU and
            nothing but ticks left to happen, after which the run stops with
            ``SimulationStalledError`` instead of ticking forever (>= 1; the default
            leaves room for restart penalties that grow with a job's age).
    """

    interval: float = 60.0
    seed: int = 0
    restart: RestartCostModel = field(default_factory=lambda: FlatRestartCost(30.0))
    max_time: float | None = None
    replica_cap: int = 64
    adaptive_batch_size: Mapping[str, int] = field(default_factory=lambda: _frozen({"ncf": 32768}))
    app_max_replicas: Mapping[str, int] = field(default_factory=lambda: _frozen({"ncf": 1}))
    round_epoch_times: bool = False
    inference_policy: str = "ats-i"
    inference_params: Mapping[str, object] = field(default_factory=lambda: _frozen({}))
    lending: bool = True
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    lend_reserve: LendReserveConfig = field(default_factory=LendReserveConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    slo_reference: str = ""
    cold_start: Mapping[str, float] = field(default_factory=lambda: DEEPBOOT_COLD_START)
    cold_start_default: float = 6.0
    host_cache: HostCacheConfig = field(default_factory=HostCacheConfig)
    event_lending: bool = False
    model_gb: Mapping[str, float] = field(default_factory=lambda: MODEL_GB)
    job_bounds: str = "reference"
    grad_min_replicas: int = 1
    profile_steps: int = 0
    check_invariants: bool = False
    stall_ticks: int = 10_000
    slowdowns: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    model_per_type: bool = True

    def __post_init__(self) -> None:
        if self.stall_ticks < 1:
            raise ConfigError(f"stall_ticks must be >= 1; got {self.stall_ticks}")
        for name, slowdown in self.slowdowns.items():
            if not (math.isfinite(slowdown) and slowdown >= 1.0):
                raise ConfigError(f"slowdown of {name!r} must be finite and >= 1; got {slowdown}")
        if not (math.isfinite(self.interval) and 0 < self.interval <= 86_400):
            raise ConfigError(f"interval must be in (0, 86400] seconds; got {self.interval}")
        if self.max_time is not None and not self.max_time >= 0:
            raise ConfigError(f"max_time must be >= 0 seconds or None; got {self.max_time}")
        if self.replica_cap < 1:
            raise ConfigError(f"replica_cap must be >= 1; got {self.replica_cap}")
        for name, value in self.adaptive_batch_size.items():
            if value < 1:
                raise ConfigError(f"adaptive_batch_size[{name!r}] must be >= 1; got {value}")
        for name, value in self.app_max_replicas.items():
            if value < 1:
                raise ConfigError(f"app_max_replicas[{name!r}] must be >= 1; got {value}")
        for name, secs in self.cold_start.items():
            if not (math.isfinite(secs) and secs >= 0):
                raise ConfigError(f"cold_start[{name!r}] must be >= 0 seconds; got {secs}")
        if not (math.isfinite(self.cold_start_default) and self.cold_start_default >= 0):
            raise ConfigError(
                f"cold_start_default must be >= 0 seconds; got {self.cold_start_default}"
            )
        if self.slo_reference not in ("", "warm-pool", "oracle"):
            raise ConfigError(
                f"slo_reference must be '', 'warm-pool' or 'oracle'; got {self.slo_reference!r}"
            )
        for name, gb in self.model_gb.items():
            if not (math.isfinite(gb) and gb > 0):
                raise ConfigError(f"model_gb[{name!r}] must be > 0 GB; got {gb}")
        if self.profile_steps < 0:
            raise ConfigError(f"profile_steps must be >= 0; got {self.profile_steps}")
        if self.grad_min_replicas not in (1, 2):
            raise ConfigError(f"grad_min_replicas must be 1 or 2; got {self.grad_min_replicas}")
        if self.job_bounds not in ("reference", "runtime"):
            raise ConfigError(
                f"job_bounds must be 'reference' or 'runtime'; got {self.job_bounds!r}"
            )
        if not self.inference_policy:
            raise ConfigError("inference_policy must name a registered inference policy")
        # Freeze caller-supplied dicts so the config stays immutable.
        if not isinstance(self.adaptive_batch_size, MappingProxyType):
            object.__setattr__(self, "adaptive_batch_size", _frozen(dict(self.adaptive_batch_size)))
        if not isinstance(self.app_max_replicas, MappingProxyType):
            object.__setattr__(self, "app_max_replicas", _frozen(dict(self.app_max_replicas)))
        if not isinstance(self.inference_params, MappingProxyType):
            object.__setattr__(self, "inference_params", _frozen(dict(self.inference_params)))
        if not isinstance(self.cold_start, MappingProxyType):
            object.__setattr__(self, "cold_start", _frozen(dict(self.cold_start)))
        if not isinstance(self.model_gb, MappingProxyType):
            object.__setattr__(self, "model_gb", _frozen(dict(self.model_gb)))

    def cold_start_of(self, model: str) -> float:
        """Start-up seconds of a new replica of ``model``."""
        return self.cold_start.get(model, self.cold_start_default)
