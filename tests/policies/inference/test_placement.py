"""ATS-I and its random and Lyra-style variants: each step of the order, and the
choice within it."""

from __future__ import annotations

import numpy as np
import pytest

from deepboot.core import ConfigError, InvalidDecisionError, JobMode, UnknownPolicyError
from deepboot.policies import inference
from deepboot.policies.inference import (
    AtsIPolicy,
    InferencePlacement,
    LyraPlacementPolicy,
    PlaceAction,
    PlacementConfig,
    RandomPlacementPolicy,
    reclaim_losses,
)
from deepboot.policies.inference.candidates import lent_gpus

from .builders import layout

RNG = np.random.default_rng(0)
FITTED = {"fitted": True}


def place(policy: object, state: object, service: str = "s1") -> InferencePlacement | None:
    return policy.place(state, service, np.random.default_rng(0))  # type: ignore[attr-defined]


# One scenario per action: the exhaustiveness table of PlaceAction.
SCENARIOS = {
    PlaceAction.WARM_PROTECT: (("F F", "P:s1/2 S:s1"), (1, 0)),
    PlaceAction.WARM_SLEEP: (("F F", "S:s2 S:s1"), (1, 1)),
    PlaceAction.COLD_FREE: (("F F", "R:s2 F"), (1, 1)),
    PlaceAction.COLD_EVICT: (("T:a T:a", "R:s2 S:s3"), (1, 1)),
    PlaceAction.COLD_RECLAIM: (("T:a T:a", "R:s2 L:a"), (1, 1)),
}


@pytest.mark.parametrize("action", list(PlaceAction), ids=lambda a: a.name)
def test_every_action_has_its_scenario(action: PlaceAction) -> None:
    nodes, gpu = SCENARIOS[action]
    out = place(AtsIPolicy(), layout(*nodes))
    assert out is not None
    assert (out.action, out.gpu) == (action, gpu)
    assert out.action.warm is (action in (PlaceAction.WARM_PROTECT, PlaceAction.WARM_SLEEP))


def test_warm_reuse_prefers_the_most_hits_then_protect() -> None:
    state = layout("F", "S:s1 P:s1/1 P:s1/4 P:s2/9 P:s1/4 S:s1")
    assert place(AtsIPolicy(), state) == InferencePlacement((1, 2), PlaceAction.WARM_PROTECT)
    tie = layout("F", "S:s1 P:s1")  # both 0 hits: PROTECT first, SLEEP stays lendable
    assert place(AtsIPolicy(), tie) == InferencePlacement((1, 1), PlaceAction.WARM_PROTECT)


def test_free_gpus_inference_pool_first_on_the_node_with_fewest_workers() -> None:
    state = layout("F F", "L:a F L:a L:a", "F L:b R:s2 F", "F F R:s3 R:s3")
    # Node 3 holds no training worker; node 2 one; node 1 three.
    assert place(AtsIPolicy(), state).gpu == (3, 0)  # type: ignore[union-attr]
    only_training_pool_free = layout("F F", "L:a R:s2")
    assert place(AtsIPolicy(), only_training_pool_free).gpu == (0, 0)  # type: ignore[union-attr]


def test_ats_i_pack_fills_the_most_fragmented_node_first() -> None:
    # Node 1 is wholly free; node 2 has one GPU left beside three replicas; node 3 has
    # two GPUs training could use (one LENT, one FREE). No node has training workers
    # but node 3, so the artifact's order takes node 1 and breaks it up; packing
    # takes node 2's last GPU and keeps node 1 whole.
    state = layout("T:a T:a", "F F F F", "R:s2 P:s3 S:s4 F", "L:a F R:s2 R:s2")
    assert place(AtsIPolicy(), state).gpu == (1, 0)  # type: ignore[union-attr]
    packed = inference.create("ats-i-pack")
    assert place(packed, state) == InferencePlacement((2, 3), PlaceAction.COLD_FREE)
    # The same order for evicting another service's SLEEP replica.
    evict = layout("T:a T:a", "S:s2 S:s2 S:s2 S:s2", "R:s2 R:s3 S:s4 R:s3")
    assert place(packed, evict) == InferencePlacement(
        (2, 2), PlaceAction.COLD_EVICT, evicts=((2, 2),)
    )
    assert place(AtsIPolicy(), evict).gpu == (1, 0)  # type: ignore[union-attr]


def test_free_beats_evicting_and_evicting_beats_reclaiming() -> None:
    state = layout("T:a F", "S:s2 L:a")
    assert place(AtsIPolicy(), state).action is PlaceAction.COLD_FREE  # type: ignore[union-attr]
    state = layout("T:a T:a", "S:s2 L:a")
    out = place(AtsIPolicy(), state)
    assert out == InferencePlacement((1, 0), PlaceAction.COLD_EVICT, evicts=((1, 0),))


@pytest.mark.parametrize(
    ("lending", "config", "gpu"),
    [
        (True, PlacementConfig(), (0, 1)),
        (False, PlacementConfig(), None),
        (False, PlacementConfig(isolate_pools_without_lending=False), (0, 1)),
        (True, PlacementConfig(use_training_pool=False), None),
    ],
    ids=["lending", "no-lending-isolated", "no-lending-shared", "inference-pool-only"],
)
def test_pools_a_cold_start_may_use(
    lending: bool, config: PlacementConfig, gpu: tuple[int, int] | None
) -> None:
    state = layout("T:a F", "R:s2 R:s3", lending=lending)
    out = place(AtsIPolicy(config), state)
    assert (out.gpu if out else None) == gpu


def test_no_reclaim_without_lending() -> None:
    state = layout("T:a T:a", "R:s2 L:a", lending=False)
    assert lent_gpus(state) == []
    for policy in (AtsIPolicy(), RandomPlacementPolicy(), LyraPlacementPolicy()):
        assert place(policy, state) is None


def test_reclaim_takes_the_gpu_whose_loss_is_least() -> None:
    # "big" holds 4 GPUs on one node: losing one costs it a little. "solo" holds 1:
    # losing it costs its whole speedup.
    state = layout(
        "T:x T:x T:x T:x",
        "L:big L:big L:big L:big",
        "L:solo R:s2 R:s2 R:s2",
        jobs={"big": FITTED, "solo": FITTED, "x": FITTED},
    )
    losses = reclaim_losses(state, lent_gpus(state))
    assert losses[:4] == pytest.approx([losses[0]] * 4)
    assert 0 < losses[0] < losses[4]
    out = place(AtsIPolicy(), state)
    assert out == InferencePlacement((1, 0), PlaceAction.COLD_RECLAIM, reclaims=(((1, 0), "big"),))


def test_a_gpu_that_only_spreads_a_job_over_nodes_is_reclaimed_first() -> None:
    # "split" runs 3 GPUs on node 1 and 1 on node 2: dropping the lone one saves an
    # inter-node sync, so its loss is the smallest of all (below "whole"'s).
    state = layout(
        "T:x",
        "L:split L:split L:split R:s2",
        "L:split L:whole L:whole L:whole",
        jobs={"split": FITTED, "whole": FITTED, "x": FITTED},
    )
    out = place(AtsIPolicy(), state)
    assert out is not None and out.reclaims == (((2, 0), "split"),)


def test_unfitted_jobs_lose_linearly_and_ties_follow_the_job_order() -> None:
    state = layout(
        "T:x", "L:b L:a", jobs={"a": {"attained_service": 10.0}, "b": {"attained_service": 20.0}}
    )
    losses = reclaim_losses(state, lent_gpus(state))
    assert losses[0] == pytest.approx(losses[1])
    # Equal losses: the job with less attained service comes first in the artifact's order.
    assert place(AtsIPolicy(), state).reclaims == (((1, 1), "a"),)  # type: ignore[union-attr]


def test_lyra_reclaims_the_whole_node_with_the_fewest_workers() -> None:
    state = layout(
        "T:x",
        "L:a L:a L:b R:s2",
        "L:c L:c R:s3 R:s3",
        "R:s2 R:s2 R:s2 R:s2",
    )
    out = place(LyraPlacementPolicy(), state)
    assert out == InferencePlacement(
        (2, 0), PlaceAction.COLD_RECLAIM, reclaims=(((2, 0), "c"), ((2, 1), "c"))
    )


def test_lyra_and_ats_i_agree_before_the_reclaim() -> None:
    for nodes in (("F F", "P:s1/2 S:s1"), ("F F", "R:s2 F"), ("T:a T:a", "R:s2 S:s3")):
        state = layout(*nodes)
        assert place(LyraPlacementPolicy(), state) == place(AtsIPolicy(), state)


def test_random_is_seeded_and_spreads_over_the_candidates() -> None:
    state = layout("F F F F", "F F F F")
    policy = RandomPlacementPolicy()
    picks = {policy.place(state, "s1", np.random.default_rng(seed)).gpu for seed in range(40)}  # type: ignore[union-attr]
    assert picks <= {(1, i) for i in range(4)}, "still the inference pool first"
    assert len(picks) > 1
    again = policy.place(state, "s1", np.random.default_rng(7))
    assert again == policy.place(state, "s1", np.random.default_rng(7))


def test_random_reclaims_one_lent_gpu() -> None:
    state = layout("T:x", "L:a L:a L:b R:s2")
    reclaimed = set()
    for seed in range(30):
        out = RandomPlacementPolicy().place(state, "s1", np.random.default_rng(seed))
        assert out is not None and len(out.reclaims) == 1
        reclaimed.add(out.reclaims[0])
    assert reclaimed == {((1, 0), "a"), ((1, 1), "a"), ((1, 2), "b")}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu": (0, 0), "action": PlaceAction.COLD_RECLAIM}, "must reclaim"),
        (
            {"gpu": (0, 0), "action": PlaceAction.COLD_FREE, "reclaims": (((0, 1), "a"),)},
            "must not reclaim",
        ),
        ({"gpu": (0, 0), "action": PlaceAction.COLD_EVICT}, "evicts exactly"),
        ({"gpu": (0, 0), "action": PlaceAction.WARM_SLEEP, "evicts": ((0, 0),)}, "must not evict"),
        (
            {
                "gpu": (0, 0),
                "action": PlaceAction.COLD_RECLAIM,
                "reclaims": (((0, 0), "a"), ((0, 0), "a")),
            },
            "twice",
        ),
    ],
    ids=[
        "reclaim-without-its-gpu",
        "free-with-reclaims",
        "evict-without-gpu",
        "warm-evicts",
        "twice",
    ],
)
def test_placements_that_contradict_their_action_are_rejected(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidDecisionError, match=message):
        InferencePlacement(**kwargs)  # type: ignore[arg-type]


def test_registry_builds_each_policy_from_strings() -> None:
    policy = inference.create("ats-i", use_training_pool="false", speedup_mode="fixed_batch")
    assert policy.name == "ats-i"
    assert policy.config == PlacementConfig(  # type: ignore[attr-defined]
        use_training_pool=False, speedup_mode=JobMode.FIXED_BATCH
    )
    assert inference.config_class("lyra") is PlacementConfig
    assert {inference.create(n).name for n in inference.names()} == set(inference.names())


@pytest.mark.parametrize(
    ("name", "params", "error", "text"),
    [
        ("lottery", {}, UnknownPolicyError, "ats-i"),
        ("ats-i", {"hits": 3}, ConfigError, "'hits'"),
        ("random", {"use_training_pool": "maybe"}, ConfigError, "use_training_pool"),
        ("lyra", {"speedup_mode": "turbo"}, ConfigError, "speedup_mode"),
    ],
    ids=["unknown-policy", "unknown-parameter", "bad-bool", "bad-enum"],
)
def test_registry_errors_name_what_to_fix(
    name: str, params: dict[str, object], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text):
        inference.create(name, **params)
