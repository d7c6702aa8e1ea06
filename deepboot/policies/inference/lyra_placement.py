"""Lyra-style placement: ATS-I, but a reclaim takes back a whole inference node.

Faithful to the artifact's Aryl mode (``infer_scheduler._aryl_schedule_training_gpu``):
when no FREE GPU or SLEEP replica is left, the inference node with the fewest training
workers (at least one; ties: lowest node id) is taken back whole: every LENT GPU on it
is reclaimed and its training workers are evicted. The task runs on the first of them;
the others come back FREE for the next tasks. Warm reuse, FREE GPUs and evictions are
ATS-I's (:mod:`deepboot.policies.inference.ats_i`), so that only the reclaim differs.
(The artifact's Aryl mode also takes FREE GPUs only on inference nodes, in node order:
``use_training_pool=False`` gets the pool half of that.)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from deepboot.core.gpu import GpuView
from deepboot.core.state import InferenceState
from deepboot.policies.inference.ats_i import most_hits
from deepboot.policies.inference.base import InferencePlacement, refuse_multi
from deepboot.policies.inference.candidates import (
    PlacementConfig,
    cold_key,
    place_in_order,
)


def whole_node(lent: list[GpuView]) -> tuple[GpuView, tuple[GpuView, ...]]:
    """The node with the fewest LENT GPUs (lowest id on ties): its first GPU, and all."""
    per_node = Counter(g.node_id for g in lent)
    node = min(per_node, key=lambda n: (per_node[n], n))
    taken = tuple(sorted((g for g in lent if g.node_id == node), key=lambda g: g.index))
    return taken[0], taken


@dataclass(frozen=True, slots=True)
class LyraPlacementPolicy:
    """ATS-I with Lyra's whole-node reclaim."""

    config: PlacementConfig = PlacementConfig()
    name: ClassVar[str] = "lyra"

    def place(
        self, state: InferenceState, service: str, rng: np.random.Generator
    ) -> InferencePlacement | None:
        """Where a task of ``service`` runs now, or None; ``state`` is never mutated
        and ``rng`` is unused."""
        del rng
        refuse_multi(self.name, state, service)
        key = cold_key(state, self.config.cold_order)
        return place_in_order(
            state,
            service,
            self.config,
            warm=most_hits,
            cold=lambda gpus: min(gpus, key=key),
            reclaim=whole_node,
        )
