"""The SLO guard of a tick (deepboot.scheduler.guard): what it holds back from
training, where it pre-warms, and what it reclaims ahead of demand."""

from __future__ import annotations

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.gpu import GpuState, GpuView
from deepboot.core.placement import Placement
from deepboot.core.service import ServiceSpec
from deepboot.core.state import JobView
from deepboot.policies.slo import ServiceNeed
from deepboot.scheduler.decision import Resize
from deepboot.scheduler.guard import Guard, guard
from deepboot.scheduler.operations import EvictReplica, Reclaim, WarmReplica
from tests.policies.builders import make_job

CLUSTER = ClusterSpec.parse("3x2", 2)  # node 0 trains; nodes 1 and 2 are inference
SERVICES = {n: ServiceSpec(n, "m", cold_start_s=8.0) for n in ("a", "b")}


def inf(
    node: int, index: int, state: GpuState, service: str | None = None, job: str | None = None
) -> GpuView:
    return GpuView(node, index, Pool.INFERENCE, state, service=service, job=job)


def train(index: int, job: str) -> GpuView:
    return GpuView(0, index, Pool.TRAINING, GpuState.TRAINING, job=job)


def jobview(name: str, nodes: tuple[int, ...]) -> JobView:
    return make_job(name, placement=nodes, fitted=True, min_replicas=1)


def run(
    needs: dict[str, ServiceNeed],
    gpus: list[GpuView],
    jobs: tuple[JobView, ...] = (),
    idle: int = 0,
) -> Guard:
    return guard(needs, gpus, jobs, SERVICES, CLUSTER, now=100.0, interval=60.0, idle=idle)


def test_nothing_needed_holds_nothing() -> None:
    gpus = [inf(1, 0, GpuState.SLEEP, "a"), inf(1, 1, GpuState.FREE)]
    out = run({}, gpus)
    assert out.ops == () and out.held == frozenset()


def test_idle_replicas_are_held_up_to_the_need_and_the_rest_lendable() -> None:
    gpus = [
        inf(1, 0, GpuState.SLEEP, "a"),
        inf(1, 1, GpuState.SLEEP, "a"),
        inf(2, 0, GpuState.PROTECT, "a"),
        inf(2, 1, GpuState.SLEEP, "b"),
    ]
    out = run({"a": ServiceNeed(warm=2, hold=2)}, gpus)
    # PROTECT counts (it is not lendable anyway): one SLEEP replica more, GPU order.
    assert out.held == {(1, 0)} and out.ops == ()


def mixed() -> tuple[list[GpuView], tuple[JobView, ...]]:
    """Job j on the training node and two lent GPUs; a FREE GPU and b's sleeping
    replica on the inference pool."""
    gpus = [
        train(0, "j"),
        train(1, "j"),
        inf(1, 0, GpuState.FREE),
        inf(1, 1, GpuState.SLEEP, "b"),
        inf(2, 0, GpuState.LENT, job="j"),
        inf(2, 1, GpuState.LENT, job="j"),
    ]
    return gpus, (jobview("j", (0, 0, 2, 2)),)


def test_missing_replicas_are_prewarmed_free_first_then_evicting_then_reclaiming() -> None:
    gpus, jobs = mixed()
    out = run({"a": ServiceNeed(warm=3, hold=3)}, gpus, jobs)
    until = 100.0 + 8.0 + 60.0
    reclaimed = [op for op in out.ops if isinstance(op, Reclaim)]
    assert len(reclaimed) == 1 and reclaimed[0].proactive and reclaimed[0].job == "j"
    gpu = reclaimed[0].gpu
    assert out.ops == (
        Reclaim(gpu, "j", proactive=True),
        Resize("j", Placement.of((0, 0, 2, 2)), Placement.of((0, 0, 2))),
        WarmReplica((1, 0), "a", until),
        EvictReplica((1, 1)),
        WarmReplica((1, 1), "a", until),
        WarmReplica(gpu, "a", until),
    )
    assert out.held == frozenset()


def test_a_held_replica_of_another_service_is_never_evicted() -> None:
    gpus = [inf(1, 0, GpuState.SLEEP, "b"), inf(1, 1, GpuState.RUNNING, "b")]
    out = run({"a": ServiceNeed(1, 1), "b": ServiceNeed(2, 2)}, gpus)
    assert out.held == {(1, 0)}
    assert out.ops == ()  # nothing left to warm a on


def test_the_in_between_regime_keeps_free_gpus_instead_of_warming() -> None:
    gpus = [inf(1, 0, GpuState.FREE), inf(1, 1, GpuState.FREE), inf(2, 0, GpuState.FREE)]
    out = run({"a": ServiceNeed(warm=0, hold=2)}, gpus)
    assert out.ops == () and out.held == {(1, 0), (1, 1)}


def test_loading_replicas_count_as_loaded() -> None:
    gpus = [inf(1, 0, GpuState.RUNNING, "a"), inf(1, 1, GpuState.FREE)]
    assert run({"a": ServiceNeed(1, 1)}, gpus).ops == ()


def test_a_replica_still_loading_does_not_stand_in_for_a_loaded_one() -> None:
    # A request found the loaded replica busy and started another (a cold start on
    # a reclaimed GPU); until that one has loaded, the loaded replica is held, not
    # lent (the runtime lent it, and a ramp's next requests waited for the load).
    gpus = [inf(1, 0, GpuState.SLEEP, "a"), inf(1, 1, GpuState.RUNNING, "a")]
    need = {"a": ServiceNeed(warm=1, hold=1)}
    starting = guard(
        need, gpus, (), SERVICES, CLUSTER, now=100.0, interval=60.0, loading=frozenset({(1, 1)})
    )
    assert starting.held == {(1, 0)} and starting.ops == ()  # and no second pre-warm
    assert run(need, gpus).held == frozenset()  # once loaded, it is the one held


def test_the_idle_pool_keeps_sleeping_replicas_then_free_gpus_then_reclaims() -> None:
    """The relaxed services' shared idle GPUs: an unheld sleeping replica first (a
    request of its service reuses it), then FREE GPUs, then lent GPUs taken back at
    the tick (proactive, with the job's shrink) and left FREE: no warm-up."""
    gpus, jobs = mixed()
    assert run({}, gpus, jobs, idle=1).held == {(1, 1)}
    assert run({}, gpus, jobs, idle=2) == Guard((), frozenset({(1, 1), (1, 0)}))
    out = run({}, gpus, jobs, idle=3)
    reclaimed = [op for op in out.ops if isinstance(op, Reclaim)]
    assert len(reclaimed) == 1 and reclaimed[0].proactive
    assert out.ops == (
        reclaimed[0],
        Resize("j", Placement.of((0, 0, 2, 2)), Placement.of((0, 0, 2))),
    )
    assert out.held == {(1, 1), (1, 0), reclaimed[0].gpu}
    # More than the pool has: every idle and lent GPU, nothing else.
    out = run({}, gpus, jobs, idle=9)
    assert len(out.held) == 4 and sum(isinstance(op, Reclaim) for op in out.ops) == 2


def test_the_idle_pool_comes_after_the_prewarms_and_never_takes_a_held_replica() -> None:
    gpus = [
        inf(1, 0, GpuState.SLEEP, "a"),
        inf(1, 1, GpuState.SLEEP, "b"),
        inf(2, 0, GpuState.FREE),
        inf(2, 1, GpuState.FREE),
    ]
    # a holds its sleeping replica and warms one more on the first FREE GPU; the idle
    # pool gets b's sleeping replica and the FREE GPU left.
    out = run({"a": ServiceNeed(warm=2, hold=2)}, gpus, idle=5)
    assert out.ops == (WarmReplica((2, 0), "a", 100.0 + 8.0 + 60.0),)
    assert out.held == {(1, 0), (1, 1), (2, 1)}


def test_the_idle_pool_keeps_the_gpus_of_the_nodes_that_cache_the_most_models() -> None:
    """With a host cache, a request the idle pool serves should start from host
    memory: its FREE (and SLEEP) GPUs come from the nodes holding the most models;
    without one, GPU order."""
    gpus = [
        inf(1, 0, GpuState.FREE),
        inf(1, 1, GpuState.FREE),
        inf(2, 0, GpuState.FREE),
        inf(2, 1, GpuState.SLEEP, "b"),
    ]
    assert run({}, gpus, idle=2).held == {(2, 1), (1, 0)}
    cached = {1: frozenset({"m"}), 2: frozenset({"m", "n"})}
    out = guard({}, gpus, (), SERVICES, CLUSTER, 100.0, 60.0, idle=2, cached=cached)
    assert out.held == {(2, 1), (2, 0)}
    out = guard({}, gpus, (), SERVICES, CLUSTER, 100.0, 60.0, idle=3, cached={1: frozenset("m")})
    assert out.held == {(2, 1), (1, 0), (1, 1)}
