"""Random placement: ATS-I's order of steps, a uniformly random choice within each.

The ablation of ATS-I's choices (the paper's "random" variant): warm reuse, FREE
(inference pool, then training pool), evict SLEEP, reclaim one LENT GPU, as ATS-I,
but the replica, GPU or reclaimed GPU is drawn from the candidates of the step with
the generator passed in. (The artifact's ``random_allocate`` is a first-fit that
displaces training wherever it lands; this keeps ATS-I's steps so that only the choice
differs.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from deepboot.core.gpu import GpuView
from deepboot.core.state import InferenceState
from deepboot.policies.inference.base import InferencePlacement, refuse_multi
from deepboot.policies.inference.candidates import PlacementConfig, place_in_order


@dataclass(frozen=True, slots=True)
class RandomPlacementPolicy:
    """ATS-I's steps with a random choice at each."""

    config: PlacementConfig = PlacementConfig()
    name: ClassVar[str] = "random"

    def place(
        self, state: InferenceState, service: str, rng: np.random.Generator
    ) -> InferencePlacement | None:
        """Where a task of ``service`` runs now, or None; ``state`` is never mutated.

        Raises:
            ConfigError: the service's replica spans several GPUs (one-GPU only).
        """
        refuse_multi(self.name, state, service)

        def pick(gpus: list[GpuView]) -> GpuView:
            return gpus[int(rng.integers(len(gpus)))]

        def reclaim(lent: list[GpuView]) -> tuple[GpuView, tuple[GpuView, ...]]:
            g = pick(lent)
            return g, (g,)

        return place_in_order(state, service, self.config, warm=pick, cold=pick, reclaim=reclaim)
