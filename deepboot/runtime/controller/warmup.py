"""Load the compiled kernels before the controller's loop needs them.

The throughput fit, the goodput tables and the Pollux search run numba kernels
(:mod:`deepboot.perf._fitkernel`, :mod:`deepboot.perf._goodputkernel`,
:mod:`deepboot.policies._slotkernel`), compiled once and cached on disk. A process
still loads each on its first call: about a second on an idle core, and many more on
a small machine while the first job's workers start. In the controller that first
call came in the turn right after the first job's first generation formed (its first
measurements: the first fit, then the first round with a fitted job), and the loop
stood still meanwhile: 12.4 and 9.7 s in two of four runs of ``bench/twin.py`` on 2
cores, during which requests waited, protect timers fell due together and the next
round decided on a stale view (none in 13 runs since). :func:`warm_kernels` makes
those first calls at start, on a made-up cluster, with a policy of its own and a
generator of its own, so the loop's policy state and random stream are untouched (a
replay, which never warms up, returns the same operations).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from deepboot.core import (
    BatchLimits,
    ClusterSpec,
    ClusterState,
    GradParams,
    JobView,
    Node,
    PerfParams,
    Placement,
)
from deepboot.perf.fit import fit_perf_params
from deepboot.policies import registry
from deepboot.policies._slotkernel import slot_knapsack

_LIMITS = BatchLimits(
    init_batch_size=128, max_batch_size=4096, min_local_bsz=32, max_local_bsz=1024
)
_PERF = PerfParams(0.0175, 0.0007, 0.13, 0.0011, 0.029, 0.00035, 2.0)
_GRAD = GradParams(sqr=0.1, var=4.0)


def warm_kernels(policy: str, params: Mapping[str, str]) -> float:
    """Make the first call of every compiled kernel the loop uses: one throughput fit,
    one allocation by a fresh ``policy`` (with ``params``) of two fitted jobs on a
    2 x 4 cluster (the goodput tables), and one node-slot knapsack (which the search
    calls only on some problems). Returns the seconds it took.

    Raises:
        ConfigError: ``policy`` or ``params`` unknown (as the loop's own would).
    """
    started = time.monotonic()
    fit_perf_params([1, 1, 2], [1, 2, 4], [32, 32, 32], [0.04, 0.04, 0.04], [0.05, 0.09, 0.2])
    cluster = ClusterSpec((Node(0, 4), Node(1, 4)))
    jobs = tuple(
        JobView(
            name=f"warm-{i}",
            application="warm-up",
            submit_time=0.0,
            attained_service=100.0 * i,
            num_restarts=0,
            placement=Placement.of(placement),
            min_replicas=0,
            max_replicas=8,
            limits=_LIMITS,
            perf_params=_PERF,
            grad_params=_GRAD,
        )
        for i, placement in enumerate(((0, 0), (1,)))
    )
    state = ClusterState(600.0, cluster, jobs, {0: 4, 1: 4})
    registry.create(policy, **params).allocate(state, np.random.default_rng(0))
    one = np.array([0, 1], dtype=np.int64)
    slot_knapsack(one, one, np.array([0.0, -1.0]), np.array([0, 2], dtype=np.int64), 1, 1)
    return time.monotonic() - started
