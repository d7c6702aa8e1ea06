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
"""

from __future__ import annotations

from dataclasses import dataclass

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
        key = cold_key(state, self.config.cold_order)

        def reclaim(lent: list[GpuView]) -> tuple[GpuView, tuple[GpuView, ...]]:
            g = least_loss(state, lent, self.config)
            return g, (g,)

        return place_in_order(
            state,
            service,
            self.config,
            warm=most_hits,
            cold=lambda gpus: min(gpus, key=key),
            reclaim=reclaim,
        )


@dataclass(frozen=True, slots=True)
class PackedPlacementConfig(PlacementConfig):
    """:class:`PlacementConfig` whose cold starts pack (the ``ats-i-pack`` defaults)."""

    cold_order: ColdOrder = ColdOrder.PACK
