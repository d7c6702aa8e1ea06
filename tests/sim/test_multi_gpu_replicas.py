"""Inference replicas that span several GPUs of one node (``gpus_per_replica`` = k),
in the simulator: a reclaim takes k GPUs of one node at once and the jobs shrink by
as many workers as it takes (AFE); the replica's GPUs move together through RUNNING,
PROTECT and SLEEP and are lent (evicted) whole; lending counts GPUs."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from test_inference_builders import Greedy, TinyApp, job

from deepboot.core import ClusterSpec, InferenceTaskSpec, Pool, Workload
from deepboot.core.errors import ConfigError
from deepboot.core.gpu import GpuState
from deepboot.core.service import ServiceSpec
from deepboot.perf.restart import FlatRestartCost
from deepboot.policies.inference import create
from deepboot.policies.inference.base import InferencePolicy
from deepboot.scheduler.events import Event, EventKind
from deepboot.sim.config import SimConfig
from deepboot.sim.engine import Simulation
from deepboot.sim.metrics import SimResult
from deepboot.sim.run import simulate

BIG = ServiceSpec("big", "tiny", cold_start_s=5.0, gpus_per_replica=4)
MID = ServiceSpec("mid", "small", cold_start_s=2.0, gpus_per_replica=2)
Trace = list[tuple[float, EventKind, dict[str, dict[int, int]], dict[tuple[int, int], tuple]]]


def req(name: str, at: float, service: str, duration: float = 10.0) -> InferenceTaskSpec:
    """A request of ``service`` (``big``: model tiny; ``mid``: model small)."""
    model = {"big": "tiny", "mid": "small"}[service]
    return InferenceTaskSpec(name, at, service, model, duration, 1)


def run(
    tasks: Sequence[InferenceTaskSpec], policy: InferencePolicy | None = None
) -> tuple[SimResult, Trace]:
    """Two jobs of 6 GPUs fill a 3x4 cluster (node 0 training, nodes 1-2 inference;
    at the first tick a: 4 on node 0 + 2 on node 1, b: 2 on node 1 + 4 on node 2),
    then ``tasks``; every event's job placements and loaded GPUs are traced (the
    ledger's invariants are checked after each)."""
    trace: Trace = []

    def seen(now: float, event: Event, sim: Simulation) -> None:
        loaded = {
            g.gpu_id: (g.state, g.service, g.replica_gpus) for g in sim.board.gpus if g.service
        }
        jobs = {name: p.counts() for name, p in sim.placements().items()}
        trace.append((now, event.kind, jobs, loaded))

    wl = Workload("multi", (job("a"), job("b", 1.0)), tuple(tasks), (BIG, MID))
    res = simulate(
        wl,
        ClusterSpec.parse("3x4", 2),
        Greedy(want=6),  # type: ignore[arg-type]
        {"tiny": TinyApp()},
        SimConfig(restart=FlatRestartCost(30.0), check_invariants=True),
        inference_policy=policy,
        on_event=seen,
    )
    return res, trace


def at(trace: Trace, t: float, kind: EventKind) -> tuple[dict[str, dict[int, int]], dict]:
    for now, k, jobs, loaded in trace:
        if now == t and k is kind:
            return jobs, loaded
    raise AssertionError(f"no {kind.name} at {t}")


def test_a_reclaim_takes_k_gpus_of_one_node_and_the_jobs_shrink_by_k() -> None:
    res, trace = run([req("t1", 100.0, "big"), req("t2", 130.0, "mid")])
    jobs, _ = at(trace, 60.0, EventKind.TICK)
    assert jobs == {"a": {0: 4, 1: 2}, "b": {1: 2, 2: 4}}
    # The 4-GPU replica takes the whole of one inference node: its 4 lent GPUs,
    # the two jobs give up 4 workers in all (6 + 6 -> 4 + 4), nothing elsewhere.
    jobs, loaded = at(trace, 100.0, EventKind.INFERENCE_ARRIVAL)
    whole = tuple((1, i) for i in range(4))
    assert loaded == {g: (GpuState.RUNNING, "big", whole) for g in whole}
    assert jobs == {"a": {0: 4}, "b": {2: 4}}
    # The 2-GPU replica: 2 GPUs of node 2 from b, which shrinks by exactly 2.
    jobs, loaded = at(trace, 130.0, EventKind.INFERENCE_ARRIVAL)
    assert jobs == {"a": {0: 4}, "b": {2: 2}}
    pair = ((2, 0), (2, 1))
    assert {g: v for g, v in loaded.items() if g[0] == 2} == {
        g: (GpuState.RUNNING, "mid", pair) for g in pair
    }
    assert res.reclaim_times == (100.0,) * 4 + (130.0,) * 2
    t1, t2 = res.inference
    assert (t1.cold, t1.delay, t2.cold, t2.delay) == (True, 5.0, True, 2.0)


def test_the_gpus_of_a_replica_move_together_and_are_lent_whole() -> None:
    _, trace = run([req("t1", 100.0, "big")])
    for state, t, kind in (
        (GpuState.PROTECT, 115.0, EventKind.INFERENCE_DONE),
        (GpuState.SLEEP, 145.0, EventKind.PROTECT_EXPIRED),
    ):
        _, loaded = at(trace, t, kind)
        assert {v[0] for v in loaded.values()} == {state}
        assert len(loaded) == 4
    # The next tick lends the sleeping replica's GPUs: it is evicted whole.
    jobs, loaded = at(trace, 180.0, EventKind.TICK)
    assert loaded == {}
    assert jobs == {"a": {0: 4, 1: 2}, "b": {1: 2, 2: 4}}


def test_busy_gpu_seconds_count_every_gpu_of_a_replica() -> None:
    res, _ = run([req("t1", 100.0, "big", duration=20.0)])
    # Loading (5 s) and serving (20 s) on 4 GPUs; then 30 s of protect time on 4.
    seconds = res.gpu_seconds
    assert seconds[Pool.INFERENCE, GpuState.RUNNING] == pytest.approx(4 * 25.0)
    assert seconds[Pool.INFERENCE, GpuState.PROTECT] == pytest.approx(4 * 30.0)
    assert max(p.running for p in res.timeline) == 4


@pytest.mark.parametrize("name", ["lyra", "random"])
def test_one_gpu_placement_policies_refuse_a_multi_gpu_service(name: str) -> None:
    with pytest.raises(ConfigError, match=f"'{name}' places one-GPU replicas only.*'big'"):
        run([req("t1", 100.0, "big")], create(name))


def test_a_one_gpu_service_evicts_a_sleeping_multi_gpu_replica_whole() -> None:
    # Node 1 (inference) holds a sleeping 2-GPU replica of "mid" by t = 100; eight
    # one-GPU requests then take the 6 FREE GPUs (node 1's two, the training node's
    # four), evict the replica whole for the 7th, and the 8th takes its other GPU.
    one = ServiceSpec("one", "tiny", cold_start_s=1.0)
    ones = tuple(InferenceTaskSpec(f"o{i}", 100.0, "one", "tiny", 50.0, 1) for i in range(8))
    evictions: list[int] = []

    def seen(now: float, event: Event, sim: Simulation) -> None:
        evictions.append(sim.board.evictions)

    res = simulate(
        Workload("mixed", (), (req("t1", 0.0, "mid"), *ones), (MID, one)),
        ClusterSpec.parse("2x4", 1),
        Greedy(),  # type: ignore[arg-type]
        {"tiny": TinyApp()},
        SimConfig(restart=FlatRestartCost(30.0), check_invariants=True),
        on_event=seen,
    )
    assert [r.delay for r in res.inference] == [2.0] + [1.0] * 8
    assert evictions[-1] == 1  # one replica evicted (its two GPUs together)
