"""The two references SLO-guarded lending is held against, built from the workload.

Both read the whole workload before the run starts, which no deployable policy can:

* **warm-pool** (not clairvoyant about timing; it knows each service's true mean
  load): every service holds, as ``guaranteed_replicas`` (warm, never lent), the
  Erlang-B replicas for its ``slo_target`` at ``rate x duration``, where ``rate`` is
  its requests over the span of all inference arrivals and ``duration`` its mean
  task duration; everything else is lent as ``deepboot`` lends it. What a
  well-tuned static ``lendingLimit`` gets.
* **oracle** (clairvoyant): SLO-guarded lending whose forecast is replaced by each
  service's exact demand (:func:`deepboot.policies.slo.demand_schedule`: the
  replicas its requests occupy if each is served on arrival). At every tick it
  holds, and pre-warms, the peak of that demand over the next horizon (a cold start
  plus a resize plus an interval): so the hold of a replica starts at least a cold
  start plus a resize before the first request that needs it, and each request
  finds its replica warm unless the inference pool is full. It is a reference, not
  a bound: a policy that lends mid-interval can give training more GPU-seconds, and
  JCT is not monotone in GPUs for every training allocator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from deepboot.core.jobs import InferenceTaskSpec
from deepboot.core.service import ServiceSpec
from deepboot.policies.forecast import replicas_for
from deepboot.policies.slo import DemandSchedule, SloConfig, demand_schedule


def warm_pool_replicas(
    tasks: Sequence[InferenceTaskSpec], services: Mapping[str, ServiceSpec], target: float | None
) -> dict[str, int]:
    """Each service's Erlang-B replicas at its true mean load (see the module
    docstring); ``target`` overrides the services' ``slo_target``."""
    if not tasks:
        return {}
    first = min(t.submit_time for t in tasks)
    last = max(t.submit_time for t in tasks)
    span = max(last - first, 1.0)
    count: dict[str, int] = {}
    busy: dict[str, float] = {}
    for t in tasks:
        count[t.service] = count.get(t.service, 0) + 1
        busy[t.service] = busy.get(t.service, 0.0) + t.duration
    out: dict[str, int] = {}
    for name, spec in services.items():
        n = count.get(name, 0)
        if not n:
            continue
        offered = (n / span) * (busy[name] / n)
        goal = spec.slo_target if target is None else target
        want = replicas_for(offered, goal, spec.concurrency)
        out[name] = min(want, spec.max_replicas) if spec.max_replicas else want
    return out


def demand_schedules(
    tasks: Sequence[InferenceTaskSpec], services: Mapping[str, ServiceSpec]
) -> dict[str, DemandSchedule]:
    """Each service's exact demand (the oracle's schedule)."""
    requests: dict[str, list[tuple[float, float]]] = {}
    for t in tasks:
        requests.setdefault(t.service, []).append((t.submit_time, t.duration))
    return {
        name: demand_schedule(reqs, services[name].concurrency) for name, reqs in requests.items()
    }


def slo_references(
    tasks: Sequence[InferenceTaskSpec],
    services: Mapping[str, ServiceSpec],
    slo: SloConfig,
    reference: str,
) -> tuple[Mapping[str, ServiceSpec], SloConfig]:
    """The services and the SLO settings a run uses: as given (``reference`` ""),
    or the reference's ("warm-pool", "oracle"). Called once, before the run, with
    the whole workload: the only place the references see the future."""
    if reference == "warm-pool":
        pool = warm_pool_replicas(tasks, services, slo.target)
        held = {
            name: dataclasses.replace(
                spec, guaranteed_replicas=max(spec.guaranteed_replicas, pool.get(name, 0))
            )
            for name, spec in services.items()
        }
        return MappingProxyType(held), slo
    if reference == "oracle":
        schedules = MappingProxyType(demand_schedules(tasks, services))
        return services, dataclasses.replace(slo, enabled=True, oracle=schedules)
    return services, slo
