"""Inference placements are validated against the snapshot before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

from deepboot.core import ClusterSpec, GpuState, GpuView, InferenceState, InvalidDecisionError, Pool
from deepboot.policies.inference import InferencePlacement, PlaceAction
from deepboot.scheduler.inference import (
    InferenceScheduler,
    lendable_capacity,
    validate_placement,
)

CLUSTER = ClusterSpec.parse("2x2", inference_nodes=1)
SERVICE = "infer-bert-1"

GPUS = (
    GpuView(0, 0, Pool.TRAINING, GpuState.TRAINING, job="a"),
    GpuView(0, 1, Pool.TRAINING, GpuState.FREE),
    GpuView(1, 0, Pool.INFERENCE, GpuState.LENT, job="a"),
    GpuView(1, 1, Pool.INFERENCE, GpuState.SLEEP, service="infer-ncf-1"),
)


def state(lending: bool = True, gpus: tuple[GpuView, ...] = GPUS) -> InferenceState:
    return InferenceState(0.0, CLUSTER, gpus, (), lending)


P = PlaceAction


@pytest.mark.parametrize(
    ("placement", "lending"),
    [
        (InferencePlacement((0, 1), P.COLD_FREE), True),
        (InferencePlacement((1, 1), P.COLD_EVICT, evicts=((1, 1),)), True),
        (InferencePlacement((1, 0), P.COLD_RECLAIM, reclaims=(((1, 0), "a"),)), True),
        (InferencePlacement((0, 1), P.COLD_FREE), False),
    ],
    ids=["free", "evict", "reclaim", "free-no-lending"],
)
def test_valid_placements_pass(placement: InferencePlacement, lending: bool) -> None:
    validate_placement(placement, state(lending), SERVICE)


@pytest.mark.parametrize(
    ("placement", "lending", "words"),
    [
        (InferencePlacement((5, 0), P.COLD_FREE), True, "unknown GPU"),
        (InferencePlacement((0, 0), P.COLD_FREE), True, "needs GPU"),
        (InferencePlacement((1, 1), P.WARM_SLEEP), True, "holds a replica"),
        (InferencePlacement((1, 0), P.COLD_RECLAIM, reclaims=(((1, 0), "b"),)), True, "from 'b'"),
        (InferencePlacement((1, 0), P.COLD_RECLAIM, reclaims=(((1, 0), "a"),)), False, "lending"),
        (InferencePlacement((0, 1), P.COLD_EVICT, evicts=((0, 1),)), True, "needs GPU"),
    ],
    ids=["unknown-gpu", "busy-gpu", "warm-other-service", "wrong-job", "no-lending", "evict-free"],
)
def test_invalid_placements_are_rejected(
    placement: InferencePlacement, lending: bool, words: str
) -> None:
    with pytest.raises(InvalidDecisionError, match=words):
        validate_placement(placement, state(lending), SERVICE)


def test_scheduler_validates_the_policys_answer() -> None:
    class Bad:
        name = "bad"

        def place(
            self, state: InferenceState, service: str, rng: np.random.Generator
        ) -> InferencePlacement | None:
            return InferencePlacement((0, 0), P.COLD_FREE)

    with pytest.raises(InvalidDecisionError):
        InferenceScheduler(Bad()).place(state(), SERVICE, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("lending", "expected"), [(True, {0: 2, 1: 2}), (False, {0: 2, 1: 0})], ids=["on", "off"]
)
def test_lendable_capacity(lending: bool, expected: dict[int, int]) -> None:
    assert dict(lendable_capacity(CLUSTER, GPUS, lending)) == expected
    running = (*GPUS[:3], GpuView(1, 1, Pool.INFERENCE, GpuState.PROTECT, service="x"))
    assert lendable_capacity(CLUSTER, running, lending)[1] == expected[1] // 2
