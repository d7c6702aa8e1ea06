"""Pollux (OSDI'21): adaptive batch size, allocation maximizing a power mean of speedups.

The objective is exactly the reference's (see :mod:`deepboot.policies.pollux_fitness`);
the search is ours (see :mod:`deepboot.policies.pollux_search`): it reaches the fitness
of the reference NSGA-II or better in a fraction of the time (``bench/pollux_search.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from deepboot.core.modes import JobMode
from deepboot.core.placement import Allocation, Placement, freeze_allocation
from deepboot.core.state import ClusterState
from deepboot.perf.speedup import SpeedupProvider, adaptive_speedup
from deepboot.policies.pollux_fitness import PolluxConfig, PolluxProblem, pollux_fitness
from deepboot.policies.pollux_search import solve

__all__ = ["PolluxConfig", "PolluxPolicy", "pollux_allocate", "pollux_fitness"]


def pollux_allocate(
    state: ClusterState, config: PolluxConfig, speedup: SpeedupProvider = adaptive_speedup
) -> Allocation:
    """The Pollux allocation of ``state`` under ``config`` with the given speedups.

    Args:
        state: The snapshot; never mutated.
        config: Objective and search parameters.
        speedup: Raw speedup function per job (default: the perf layer's ADAPTIVE one).

    Returns:
        Job name -> placement; jobs left out hold no GPU.
    """
    problem = PolluxProblem(state, config, speedup)
    matrix = solve(problem)
    placements = {name: Placement(nodes) for name, nodes in problem.allocation_of(matrix).items()}
    return freeze_allocation(placements)


@dataclass(frozen=True, slots=True)
class PolluxPolicy:
    """Maximizes the Pollux fitness over jobs x nodes allocation matrices."""

    config: PolluxConfig = PolluxConfig()
    name: ClassVar[str] = "pollux"
    job_mode: ClassVar[JobMode] = JobMode.ADAPTIVE

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        """Return the allocation; ``state`` is never mutated and ``rng`` is unused
        (the search is deterministic)."""
        del rng
        return pollux_allocate(state, self.config)
