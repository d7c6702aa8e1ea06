"""One GPU type per job, for allocators that do not know types.

On a cluster of several GPU types a job runs on one type (a synchronous job on two
types runs at its slower type's pace, and a change of type is a restart). An
allocator that sees only GPU counts per node (Pollux's search, DeepBoot's ATS-T, the
top-up) may hand a job GPUs of several types; :func:`one_type_each` then keeps the
type holding most of the job's GPUs and drops the others, which stay idle until the
next decision, as Sia's simulator does for its Pollux baseline (SOSP'23; its
artifact's ``fix_allocations_by_dropping``). Ties go to the type the job runs on now
(no restart), then to the type written last in the cluster spec (Sia breaks ties
toward its fastest type, and a spec that lists types slowest first, as its own does,
gives the same order).

A pure function of the allocation and the cluster; on one type it returns the
allocation unchanged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from deepboot.core.cluster import ClusterSpec
from deepboot.core.placement import Placement


def one_type_each(
    allocation: Mapping[str, Placement],
    cluster: ClusterSpec,
    current: Mapping[str, Placement],
    stay: bool = False,
) -> dict[str, Placement]:
    """``allocation`` with each placement cut to one GPU type (see the module doc).

    Args:
        allocation: Job name -> placement, as an allocator returned it.
        cluster: The cluster (node types).
        current: Job name -> the placement it holds now (one type, or empty).
        stay: A job holding GPUs keeps its type whatever the counts (the top-up,
            which only grows jobs, never moves one to another type), where the
            allocation holds any GPU of that type.

    Returns:
        A new mapping; placements on one type are the same objects.
    """
    if not cluster.heterogeneous:
        return dict(allocation)
    types = cluster.node_types()
    rank = {t: i for i, t in enumerate(cluster.gpu_types)}
    out: dict[str, Placement] = {}
    for name, placement in allocation.items():
        counts = Counter(types[n] for n in placement.node_ids)
        if len(counts) <= 1:
            out[name] = placement
            continue
        held = current.get(name)
        now = types[held.node_ids[0]] if held else None
        keep: str | None = now
        if not (stay and now in counts):
            keep = max(counts, key=lambda t: (counts[t], t == now, rank.get(t or "", -1)))
        out[name] = Placement(tuple(n for n in placement.node_ids if types[n] == keep))
    return out
