"""One GPU type per job for type-unaware allocators (deepboot.policies.typecut)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.core.cluster import ClusterSpec
from deepboot.core.placement import EMPTY, Placement
from deepboot.policies.typecut import one_type_each

# Nodes 0-1 t4 (4 GPUs), 2 rtx (8), 3 a100 (8).
TYPED = ClusterSpec.parse("t4:2x4,rtx:1x8,a100:1x8")


def test_the_type_holding_most_of_the_job_stays() -> None:
    got = one_type_each({"a": Placement((0, 0, 1, 3))}, TYPED, {})
    assert got == {"a": Placement((0, 0, 1))}


def test_a_tie_goes_to_the_type_the_job_runs_on_then_to_the_type_written_last() -> None:
    alloc = {"a": Placement((0, 0, 3, 3))}
    assert one_type_each(alloc, TYPED, {"a": Placement((1,))}) == {"a": Placement((0, 0))}
    assert one_type_each(alloc, TYPED, {}) == {"a": Placement((3, 3))}
    assert one_type_each({"a": Placement((0, 2))}, TYPED, {}) == {"a": Placement((2,))}


def test_staying_keeps_the_type_a_job_holds_whatever_the_counts() -> None:
    alloc = {"a": Placement((0, 3, 3, 3))}
    held = {"a": Placement((0,))}
    assert one_type_each(alloc, TYPED, held, stay=True) == {"a": Placement((0,))}
    assert one_type_each(alloc, TYPED, held) == {"a": Placement((3, 3, 3))}


def test_one_type_leaves_the_allocation_as_it_is() -> None:
    alloc = {"a": Placement((0, 1, 2)), "b": EMPTY}
    assert one_type_each(alloc, ClusterSpec.parse("4x4"), {}) == alloc
    assert one_type_each(alloc, ClusterSpec.parse("t4:4x4"), {}) == alloc


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from("abcde"),
        st.lists(st.integers(0, 3), max_size=12).map(lambda ns: Placement(tuple(ns))),
        max_size=5,
    ),
    st.dictionaries(st.sampled_from("abcde"), st.sampled_from([0, 1, 2, 3]), max_size=5),
    st.booleans(),
)
def test_every_placement_is_cut_to_one_type_of_its_own_gpus(
    alloc: dict[str, Placement], held_node: dict[str, int], stay: bool
) -> None:
    held = {name: Placement((node,)) for name, node in held_node.items()}
    types = TYPED.node_types()
    got = one_type_each(alloc, TYPED, held, stay=stay)
    assert got.keys() == alloc.keys()
    for name, placement in got.items():
        assert len({types[n] for n in placement.node_ids}) <= 1
        rest = list(alloc[name].node_ids)
        for n in placement.node_ids:
            rest.remove(n)  # a sub-multiset of what the allocator gave
        kept = {types[n] for n in placement.node_ids}
        assert all(types[n] not in kept for n in rest)  # a whole type kept
        if alloc[name]:
            assert placement  # never cut to nothing
        own = types[held[name].node_ids[0]] if name in held else None
        if stay and any(types[n] == own for n in alloc[name].node_ids):
            assert kept == {own}
