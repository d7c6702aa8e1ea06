"""ATS-I: DeepBoot's placement of an inference task on its arrival (§2.2).

Faithful to the reference artifact (``simulator.py`` for warm reuse,
``infer_scheduler.py`` for cold starts and reclaims):

1. Warm reuse: the same service's PROTECT or SLEEP replica with the most hits (the
   artifact sorts its pods by hit count). Ties: PROTECT before SLEEP (a SLEEP replica
   stays lendable), then GPU order.
2. A FREE GPU, inference pool first, then the training pool; within a pool the node
   with the fewest training workers first (the artifact's ``node_priority``), then
   GPU order. ``ats-i-pack`` (ours) takes the node with the fewest GPUs training
   could use instead (:class:`~deepboot.policies.inference.candidates.ColdOrder`).
3. Another service's SLEEP replica, evicted; same order.
4. The single LENT GPU whose loss ``speedup_j(N, K) - speedup_j(N', K - 1)`` is least
   (the artifact's exhaustive search over one-GPU removals). Ties: the artifact's job
   order (pinned, attained service, submission), then GPU order.

Deviation: the artifact's step 4 may take any training GPU, in either pool; here only
LENT GPUs are reclaimed (the training pool belongs to training).

Beyond the paper, with a host-memory model cache (``--host-cache-gb``): a new
replica on a node whose memory holds its model starts in about a second instead of
its cold start, so steps 2-4 take such a node's GPU first (``prefer_host``): a FREE
one, an evictable SLEEP one, and the least-loss LENT one among those nodes' before
any other. When the host start meets the task's SLO and its cold start does not
(``InferenceState.host_first``), the caching nodes go first across the steps too: a
reclaim there before a FREE GPU elsewhere, whose cold start would miss the SLO.
Without a cache (no node holds the model) nothing changes.

A sleeping server (``InferenceState.sleeping``: a server process kept asleep on its
GPUs while they are lent; its wake is a host start, but only on those very GPUs):
with ``prefer_host``, each step that starts a new replica takes the exact GPUs of a
sleeping server of the task's service first, before any other host-cache node. An
empty mapping changes nothing.

A service whose replica spans k > 1 GPUs of one node (``gpus_per_replica``): the
same steps over whole node sets (:mod:`deepboot.policies.inference.multi`): a node
with k FREE GPUs, then one where evicting whole SLEEP replicas completes them, then
the node whose reclaimed LENT GPUs lose training the least (the loss of a set, not
a sum of one-GPU losses).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from deepboot.core.gpu import GpuState, GpuView
from deepboot.core.state import InferenceState
from deepboot.policies.allocation import reference_order
from deepboot.policies.inference.base import InferencePlacement
from deepboot.policies.inference.candidates import (
    ColdOrder,
    PlacementConfig,
    cold_key,
    place_in_order,
    reclaim_losses,
)
from deepboot.policies.inference.multi import place_multi


def most_hits(replicas: list[GpuView]) -> GpuView:
    """The warm replica ATS-I reuses: most hits, PROTECT first, then GPU order."""
    return min(
        replicas, key=lambda g: (-g.hits, g.state is not GpuState.PROTECT, g.node_id, g.index)
    )


def least_loss(state: InferenceState, lent: list[GpuView], cfg: PlacementConfig) -> GpuView:
    """The LENT GPU whose reclaim loses the least speedup (see the module docstring)."""
    losses = reclaim_losses(state, lent, cfg.speedup_mode)
    rank = {job.name: i for i, job in enumerate(reference_order(state.jobs))}
    last = len(rank)
    best = min(
        range(len(lent)),
        key=lambda i: (losses[i], rank.get(lent[i].job or "", last), lent[i].gpu_id),
    )
    return lent[best]


@dataclass(frozen=True, slots=True)
class AtsIPolicy:
    """ATS-I: warm reuse, FREE, evict SLEEP, then reclaim the least-loss lent GPU."""

    config: PlacementConfig = PlacementConfig()

    @property
    def name(self) -> str:
        """``ats-i``, or ``ats-i-pack`` when its cold starts pack."""
        return "ats-i-pack" if self.config.cold_order is ColdOrder.PACK else "ats-i"

    def place(
        self, state: InferenceState, service: str, rng: np.random.Generator
    ) -> InferencePlacement | None:
        """Where a task of ``service`` runs now, or None; ``state`` is never mutated
        and ``rng`` is unused."""
        del rng
        host = state.host_nodes if self.config.prefer_host else frozenset()
        if state.gpus_per_replica > 1:
            return place_multi(state, service, self.config, most_hits, host)
        key = cold_key(state, self.config.cold_order)
        # The GPUs of the service's sleeping one-GPU servers: each step's first choice.
        own = (
            frozenset(ids[0] for ids in state.sleeping_sets(service) if len(ids) == 1)
            if self.config.prefer_host and state.sleeping
            else frozenset()
        )

        def cold(gpus: list[GpuView]) -> GpuView:
            if own:
                return min(
                    gpus, key=lambda g: (g.gpu_id not in own, g.node_id not in host, *key(g))
                )
            return min(gpus, key=lambda g: (g.node_id not in host, *key(g)))

        def reclaim(lent: list[GpuView]) -> tuple[GpuView, tuple[GpuView, ...]]:
            # A host start (about a second) instead of a cold one is worth more to
            # the request than the difference in loss between two lent GPUs.
            near = [g for g in lent if g.gpu_id in own] or [g for g in lent if g.node_id in host]
            g = least_loss(state, near or lent, self.config)
            return g, (g,)

        placed = place_in_order(
            state, service, self.config, warm=most_hits, cold=cold, reclaim=reclaim
        )
        if (
            placed is None
            or placed.action.warm
            or not (host and state.host_first)
            or placed.gpu[0] in host
        ):
            return placed
        # The steps over the caching nodes alone: a host start in any of them.
        near = replace(state, gpus=tuple(g for g in state.gpus if g.node_id in host))
        return (
            place_in_order(near, service, self.config, warm=most_hits, cold=cold, reclaim=reclaim)
            or placed
        )


@dataclass(frozen=True, slots=True)
class PackedPlacementConfig(PlacementConfig):
    """:class:`PlacementConfig` whose cold starts pack (the ``ats-i-pack`` defaults)."""

    cold_order: ColdOrder = ColdOrder.PACK
