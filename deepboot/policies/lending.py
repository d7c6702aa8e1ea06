"""Predictive lending: which idle inference GPUs to keep back from a training round.

DeepBoot lends every FREE and SLEEP inference GPU at each tick (ALGORITHMS.md §2.4).
On a trace where each service's tasks come every minute or two, that lends out the
very replicas the next arrivals would reuse: the arrival then finds no warm replica
and no FREE GPU, and ATS-I reclaims a lent GPU. Each reclaim costs a cold start for
inference and a resize for training that pauses every worker of the job, and ATS-I's
least-loss rule takes them from the same large jobs again and again: on ``small.csv``
that cycle is half of DeepBoot's restarts, and one job restarts 268 times.

The reserve keeps back, per service s, the replicas its recent load says an arrival
will find busy, and only for services likely to see an arrival before the next tick:

* ``rate_s``: arrivals in the last ``window_s`` seconds / ``window_s``;
  ``duration_s``: the mean run time of its recently finished tasks (both measured by
  the caller from the past only);
* if ``P[no arrival within the horizon] = exp(-rate_s * horizon) >= target`` the
  service is quiet: keep nothing;
* else an arrival sees ``Poisson(rate_s * duration_s)`` tasks running (M/G/inf,
  arrivals see time averages), so ``r_s = q + 1`` replicas serve it warm with
  probability ``target``, q the ``target`` quantile of that Poisson;
* keep ``r_s - (RUNNING + PROTECT replicas of s)`` of s's SLEEP replicas (GPU
  order), and, when s has too few, that many FREE inference-pool GPUs for it.

When inference is idle the reserve is empty and training gets every GPU, as in
DeepBoot. Pure: a function of the GPU views and the measured loads.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from deepboot.core.cluster import Pool
from deepboot.core.gpu import GpuId, GpuState, GpuView
from deepboot.perf import detmath
from deepboot.policies.registration import MAX_DELAY_S, require


@dataclass(frozen=True, slots=True)
class LendReserveConfig:
    """Parameters of the predictive lending reserve.

    Attributes:
        enabled: Keep idle replicas back from lending (False: DeepBoot's rule, lend
            every FREE and SLEEP inference GPU).
        target: In [0, 1). A service is kept warm when it sees an arrival before the
            next tick with probability above ``1 - target``, and then with enough
            replicas that an arrival finds one idle with probability ``target``.
            0 keeps nothing back.
        window_s: Seconds of history the rates and durations are measured over (> 0).
        horizon_s: Seconds the reserve must cover; None means the scheduling
            interval (a lent GPU is held at least until the next tick).
    """

    enabled: bool = False
    target: float = 0.7
    window_s: float = 600.0
    horizon_s: float | None = None

    def __post_init__(self) -> None:
        require(0.0 <= self.target < 1.0, "target", f"must be in [0, 1); got {self.target}")
        require(
            math.isfinite(self.window_s) and 0 < self.window_s <= MAX_DELAY_S,
            "window_s",
            f"must be in (0, {MAX_DELAY_S:g}] seconds; got {self.window_s}",
        )
        require(
            self.horizon_s is None
            or (math.isfinite(self.horizon_s) and 0 < self.horizon_s <= MAX_DELAY_S),
            "horizon_s",
            f"must be in (0, {MAX_DELAY_S:g}] seconds, or None; got {self.horizon_s}",
        )


def poisson_quantile(mean: float, target: float) -> int:
    """The smallest n with ``P[Poisson(mean) <= n] >= target`` (0 for mean <= 0).

    Raises:
        ValueError: ``target`` is not in [0, 1) or ``mean`` is not finite.
    """
    if not 0.0 <= target < 1.0:
        raise ValueError(f"target must be in [0, 1); got {target}")
    if not math.isfinite(mean):
        raise ValueError(f"mean must be finite; got {mean}")
    if mean <= 0.0:
        return 0
    term = detmath.exp_scalar(-mean)
    cdf, n = term, 0
    while cdf < target:
        n += 1
        term *= mean / n
        cdf += term
    return n


@dataclass(frozen=True, slots=True)
class ServiceLoad:
    """Recent load of one inference service, measured from the past only.

    Attributes:
        rate: Arrivals per second (>= 0).
        duration_s: Mean run time of a task, seconds (>= 0; 0 when none finished).
    """

    rate: float
    duration_s: float = 0.0


def replicas_needed(
    load: ServiceLoad, horizon_s: float, target: float, concurrency: int = 1
) -> int:
    """Replicas of a service to hold warm (see the module docstring); 0 when quiet.

    The tasks to have room for (those in flight, at the ``target`` quantile, and the
    next arrival) fill ``concurrency`` slots per replica."""
    if load.rate <= 0.0 or detmath.exp_scalar(-load.rate * horizon_s) >= target:
        return 0
    tasks = poisson_quantile(load.rate * load.duration_s, target) + 1
    return -(-tasks // max(concurrency, 1))


def reserved_gpus(
    gpus: Iterable[GpuView],
    loads: Mapping[str, ServiceLoad],
    horizon_s: float,
    config: LendReserveConfig,
    concurrency: Mapping[str, int] | None = None,
    gpus_per_replica: Mapping[str, int] | None = None,
) -> frozenset[GpuId]:
    """Idle inference-pool GPUs (SLEEP or FREE) to keep back from this training round.

    Args:
        gpus: Every GPU of the cluster (only inference-pool ones can be kept).
        loads: Recent load of each service (missing: quiet).
        horizon_s: Seconds the reserve must cover (used when ``config.horizon_s`` is
            None), > 0.
        config: The reserve's parameters.
        concurrency: Tasks one replica of each service serves at once (missing: 1).
        gpus_per_replica: GPUs one replica of each service spans (missing: 1): the
            replicas are counted once each (by their lead GPU) and kept whole, and a
            missing replica keeps that many FREE GPUs.

    Returns:
        GPU ids to leave out of ``ClusterState.capacity``; empty when disabled.
    """
    if not config.enabled or config.target == 0.0:
        return frozenset()
    horizon = config.horizon_s if config.horizon_s is not None else horizon_s
    pool = [g for g in gpus if g.pool is Pool.INFERENCE]
    busy = Counter(
        g.service
        for g in pool
        if g.state in (GpuState.RUNNING, GpuState.PROTECT) and g.service and g.lead
    )
    sleeping: dict[str, list[GpuView]] = {}
    for g in pool:
        if g.state is GpuState.SLEEP and g.service and g.lead:
            sleeping.setdefault(g.service, []).append(g)
    sizes = gpus_per_replica or {}
    free = [g for g in pool if g.state is GpuState.FREE]
    kept: list[GpuId] = []
    deficit = 0
    # Sorted services: the FREE GPUs go to the deficits in a deterministic order.
    for service in sorted(loads):
        slots = (concurrency or {}).get(service, 1)
        need = replicas_needed(loads[service], horizon, config.target, slots) - busy[service]
        if need <= 0:
            continue
        mine = sorted(sleeping.get(service, []), key=lambda g: g.gpu_id)[:need]
        kept.extend(gpu for g in mine for gpu in g.members)
        deficit += (need - len(mine)) * sizes.get(service, 1)
    kept.extend(g.gpu_id for g in sorted(free, key=lambda g: g.gpu_id)[:deficit])
    return frozenset(kept)
