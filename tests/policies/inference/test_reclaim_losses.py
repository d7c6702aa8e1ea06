"""reclaim_losses asks each job's speedups once; the losses are those of asking per GPU."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from deepboot.core import GpuState, GpuView, InferenceState, JobMode
from deepboot.perf.speedup import linear_speedup, speedup_fn
from deepboot.policies.allocation import fair_replicas, fair_share_base
from deepboot.policies.inference import reclaim_losses
from deepboot.policies.inference.candidates import job_counts, lent_gpus

from .builders import layout


def per_gpu_losses(state: InferenceState, gpus: list[GpuView]) -> list[float]:
    """reclaim_losses as first written: one speedup call per GPU (the specification)."""
    counts = job_counts(state)
    views = {j.name: j for j in state.jobs}
    usable = sum(1 for g in state.gpus if g.state not in (GpuState.RUNNING, GpuState.PROTECT))
    fair = fair_replicas(usable, max(len(views), len(counts), 1))
    out = []
    for g in gpus:
        name = g.job or ""
        view = views.get(name)
        fn = linear_speedup if view is None else speedup_fn(view, JobMode.ADAPTIVE)
        base = fair_share_base(fn, fair)
        per_node = counts.get(name, Counter({g.node_id: 1}))
        k = max(sum(per_node.values()), 1)
        n = max(len(per_node), 1)
        n_after = n - 1 if per_node.get(g.node_id, 0) <= 1 else n
        values = fn(np.array([n, n_after]), np.array([k, k - 1]))
        loss = (float(values[0]) - float(values[1])) / base
        out.append(loss if math.isfinite(loss) else 0.0)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_reclaim_losses_equal_the_per_gpu_computation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    names = ["a", "b", "c", "d"]
    tokens = ["F", "R:s1", "S:s2"] + [f"L:{j}" for j in names]
    nodes = ["T:a T:b T:c T:d"] + [" ".join(rng.choice(tokens, 4)) for _ in range(6)]
    fitted = {j: {"fitted": True} for j in names if rng.random() < 0.7}
    state = layout(*nodes, jobs=fitted)
    lent = lent_gpus(state)
    assert lent
    assert reclaim_losses(state, lent).tolist() == per_gpu_losses(state, lent)
