"""Placement helpers of the fixed-size policies."""

from __future__ import annotations

import pytest

from deepboot.core import Placement
from deepboot.policies.packing import Packing, keep_or_pack, pack, requested_replicas

from .builders import make_job


@pytest.mark.parametrize(
    ("rule", "free", "gpus", "expected"),
    [
        (Packing.MOST_FREE, {0: 2, 1: 4, 2: 3}, 2, (1, 1)),
        (Packing.MOST_FREE, {0: 2, 1: 4, 2: 3}, 6, (1, 1, 1, 1, 2, 2)),
        (Packing.MOST_FREE, {0: 3, 1: 3}, 1, (0,)),
        (Packing.BEST_FIT, {0: 2, 1: 4, 2: 3}, 2, (0, 0)),
        (Packing.BEST_FIT, {0: 2, 1: 4, 2: 3}, 3, (2, 2, 2)),
        (Packing.BEST_FIT, {0: 2, 1: 4, 2: 3}, 6, (0, 0, 1, 1, 1, 1)),
        (Packing.BEST_FIT, {0: 1, 1: 1}, 2, (0, 1)),
    ],
    ids=[
        "most-free-fullest-node",
        "most-free-spills-to-next",
        "most-free-tie-lowest-id",
        "best-fit-smallest-that-fits",
        "best-fit-exact",
        "best-fit-fewest-nodes",
        "best-fit-spread-when-needed",
    ],
)
def test_pack_rules(
    rule: Packing, free: dict[int, int], gpus: int, expected: tuple[int, ...]
) -> None:
    left = dict(free)
    placement = pack(gpus, left, rule)
    assert placement == Placement(expected)
    for node, count in free.items():
        assert left[node] == count - placement.counts().get(node, 0)


@pytest.mark.parametrize("rule", list(Packing), ids=[r.value for r in Packing])
def test_every_rule_refuses_what_does_not_fit(rule: Packing) -> None:
    free = {0: 1, 1: 2}
    assert pack(4, free, rule) is None
    assert free == {0: 1, 1: 2}
    assert pack(3, free, rule) is not None
    assert free == {0: 0, 1: 0}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"target_num_replicas": 4, "max_replicas": 8}, 4),
        ({"target_num_replicas": None, "max_replicas": 8}, 1),
        ({"target_num_replicas": 1, "min_replicas": 2, "max_replicas": 8}, 2),
        ({"target_num_replicas": 8, "max_replicas": 4}, 0),
        ({"target_num_replicas": 1, "max_replicas": 0}, 0),
    ],
    ids=["request", "no-request", "raised-to-min", "over-max", "zero-max"],
)
def test_requested_replicas(kwargs: dict[str, int | None], expected: int) -> None:
    assert requested_replicas(make_job(**kwargs)) == expected  # type: ignore[arg-type]


def test_keep_or_pack_keeps_fitting_placements_first() -> None:
    stay = make_job("stay", placement=(1, 1))
    moved = make_job("moved", placement=(0, 0, 0))  # now wants only 2
    free = {0: 4, 1: 2}
    out = keep_or_pack([(moved, 2), (stay, 2)], free, Packing.MOST_FREE)
    assert out["stay"] == Placement((1, 1))
    assert out["moved"] == Placement((0, 0))
    assert free == {0: 2, 1: 0}
