"""ATS-I with a host-memory model cache (``InferenceState.host_nodes``): each step
that starts a new replica takes a GPU of a node whose memory holds the model first
(a host start, about a second, instead of a cold start); without such a node, or with
``prefer_host`` off, it places exactly as DeepBoot's ATS-I."""

from __future__ import annotations

import dataclasses

import numpy as np

from deepboot.policies.inference import AtsIPolicy, InferencePlacement, PlaceAction
from deepboot.policies.inference.candidates import PlacementConfig

from .builders import layout

FITTED = {"fitted": True}


DEFAULT = PlacementConfig()


def _place(state: object, config: PlacementConfig = DEFAULT) -> InferencePlacement:
    out = AtsIPolicy(config).place(state, "s1", np.random.default_rng(0))  # type: ignore[arg-type]
    assert out is not None
    return out


def test_a_cold_start_takes_a_free_gpu_where_the_model_is_in_memory() -> None:
    state = layout("T:a T:a", "F F", "L:a F")  # ATS-I alone: node 1 (no training worker)
    assert _place(state).gpu == (1, 0)
    cached = dataclasses.replace(state, host_nodes=frozenset({2}))
    assert _place(cached) == InferencePlacement((2, 1), PlaceAction.COLD_FREE)
    off = PlacementConfig(prefer_host=False)
    assert _place(cached, off).gpu == (1, 0)


def test_an_eviction_takes_a_sleep_replica_where_the_model_is_in_memory() -> None:
    state = layout("T:a T:a", "S:s2 R:s3", "S:s4 R:s3")
    assert _place(state).gpu == (1, 0)
    cached = dataclasses.replace(state, host_nodes=frozenset({2}))
    assert _place(cached) == InferencePlacement((2, 0), PlaceAction.COLD_EVICT, evicts=((2, 0),))


def test_a_reclaim_takes_the_least_loss_gpu_of_the_nodes_that_hold_the_model() -> None:
    # "big" loses least (4 GPUs on node 1); "solo" more (its only GPU, on node 2).
    state = layout(
        "T:x T:x T:x T:x",
        "L:big L:big L:big L:big",
        "L:solo R:s2 R:s2 R:s2",
        jobs={"big": FITTED, "solo": FITTED, "x": FITTED},
    )
    assert _place(state).reclaims == (((1, 0), "big"),)
    cached = dataclasses.replace(state, host_nodes=frozenset({2}))
    assert _place(cached) == InferencePlacement(
        (2, 0), PlaceAction.COLD_RECLAIM, reclaims=(((2, 0), "solo"),)
    )
    elsewhere = dataclasses.replace(state, host_nodes=frozenset({0}))  # no lent GPU there
    assert _place(elsewhere).reclaims == (((1, 0), "big"),)


def test_warm_reuse_still_comes_first() -> None:
    state = dataclasses.replace(layout("T:a", "P:s1 F", "F F"), host_nodes=frozenset({2}))
    assert _place(state) == InferencePlacement((1, 0), PlaceAction.WARM_PROTECT)


def test_host_first_reclaims_where_the_model_is_rather_than_cold_start_on_a_free_gpu() -> None:
    # A FREE GPU on node 1 (a cold start there misses the SLO), a lent one on node 2,
    # whose memory holds the model (a host start there meets it).
    state = layout("T:x T:x", "F R:s2", "L:big R:s3", jobs={"big": FITTED, "x": FITTED})
    cached = dataclasses.replace(state, host_nodes=frozenset({2}))
    assert _place(cached) == InferencePlacement((1, 0), PlaceAction.COLD_FREE)
    first = dataclasses.replace(cached, host_first=True)
    assert _place(first) == InferencePlacement(
        (2, 0), PlaceAction.COLD_RECLAIM, reclaims=(((2, 0), "big"),)
    )
    # Nothing to take on the caching nodes: the usual order's choice stands.
    busy = dataclasses.replace(
        layout("T:x T:x", "F R:s2", "R:s4 R:s3"), host_nodes=frozenset({2}), host_first=True
    )
    assert _place(busy) == InferencePlacement((1, 0), PlaceAction.COLD_FREE)


def test_host_first_still_reuses_a_warm_replica_anywhere() -> None:
    state = dataclasses.replace(
        layout("T:a", "S:s1 F", "F F"), host_nodes=frozenset({2}), host_first=True
    )
    assert _place(state) == InferencePlacement((1, 0), PlaceAction.WARM_SLEEP)
