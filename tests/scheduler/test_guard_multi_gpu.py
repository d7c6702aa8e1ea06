"""The SLO guard and its Erlang B sizing for a service whose replica spans k GPUs
of one node: needs count replicas (servers), a held replica keeps all of its GPUs,
a pre-warm takes a whole node set (reclaiming the least-loss one), and the pool's
capacity counts GPUs."""

from __future__ import annotations

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.gpu import GpuState, GpuView
from deepboot.core.service import ServiceSpec
from deepboot.core.state import JobView
from deepboot.policies.forecast import ArrivalHistory, replicas_for
from deepboot.policies.lending import ServiceLoad
from deepboot.policies.slo import (
    ServiceNeed,
    SloConfig,
    idle_need,
    idle_need_multi,
    service_needs,
)
from deepboot.scheduler.decision import Resize
from deepboot.scheduler.guard import guard
from deepboot.scheduler.operations import Reclaim, WarmReplica
from tests.policies.builders import make_job

CLUSTER = ClusterSpec.parse("3x4", 2)  # node 0 trains; nodes 1 and 2 are inference
BIG = ServiceSpec("big", "m", cold_start_s=60.0, gpus_per_replica=4)
NODE1 = tuple((1, i) for i in range(4))
NODE2 = tuple((2, i) for i in range(4))


def inf(gpu: tuple[int, int], state: GpuState, service: str | None = None, job: str | None = None,
        whole: tuple[tuple[int, int], ...] = ()) -> GpuView:  # fmt: skip
    return GpuView(*gpu, Pool.INFERENCE, state, service=service, job=job, replica_gpus=whole)


def jobview(name: str, nodes: tuple[int, ...]) -> JobView:
    return make_job(name, placement=nodes, fitted=True, min_replicas=1)


def test_a_held_replica_keeps_all_of_its_gpus_and_counts_once() -> None:
    gpus = [inf(g, GpuState.SLEEP, "big", whole=NODE1) for g in NODE1]
    gpus += [inf(g, GpuState.FREE) for g in NODE2]
    out = guard({"big": ServiceNeed(1, 1)}, gpus, (), {"big": BIG}, CLUSTER, 0.0, 60.0)
    assert out.held == frozenset(NODE1) and out.ops == ()  # one replica: nothing to warm
    out = guard({"big": ServiceNeed(2, 2)}, gpus, (), {"big": BIG}, CLUSTER, 0.0, 60.0)
    assert out.ops == (WarmReplica((2, 0), "big", 120.0, NODE2),)


def test_a_prewarm_reclaims_the_node_whose_set_loses_least_and_jobs_shrink_by_it() -> None:
    # j holds node 0 and all of node 1 (8 GPUs); i holds all of node 2 only (its 4).
    gpus = [GpuView(0, i, Pool.TRAINING, GpuState.TRAINING, job="j") for i in range(4)]
    gpus += [inf(g, GpuState.LENT, job="j") for g in NODE1]
    gpus += [inf(g, GpuState.LENT, job="i") for g in NODE2]
    jobs = (jobview("i", (2,) * 4), jobview("j", (0,) * 4 + (1,) * 4))
    out = guard({"big": ServiceNeed(1, 1)}, gpus, jobs, {"big": BIG}, CLUSTER, 0.0, 60.0)
    reclaims = [op for op in out.ops if isinstance(op, Reclaim)]
    resizes = [op for op in out.ops if isinstance(op, Resize)]
    warm = [op for op in out.ops if isinstance(op, WarmReplica)]
    assert len(reclaims) == 4 and len({op.gpu[0] for op in reclaims}) == 1
    assert all(op.proactive for op in reclaims)
    (resize,) = resizes  # one job, shrunk by the 4 it lost
    assert len(resize.old.node_ids) - len(resize.new.node_ids) == 4
    assert warm == [WarmReplica(reclaims[0].gpu, "big", 120.0, tuple(op.gpu for op in reclaims))]


def _history(rate: float) -> ArrivalHistory:
    return ArrivalHistory(60.0, tuple([int(rate * 60)] * 30), 0.0)


def test_erlang_b_counts_replicas_and_the_pool_gpus() -> None:
    config = SloConfig(enabled=True, burst_sizing=False)
    one = ServiceSpec("one", "m", cold_start_s=60.0, slo_wait_s=1.0)
    big = ServiceSpec("big", "m", cold_start_s=60.0, slo_wait_s=1.0, gpus_per_replica=4)
    histories = {"one": _history(0.5), "big": _history(0.5)}
    loads = {n: ServiceLoad(rate=0.5, duration_s=8.0) for n in ("one", "big")}
    needs = service_needs({"one": one, "big": big}, histories, loads, 0.0, 60.0, config)
    # The same load needs the same servers (Erlang B at 4 Erlangs), whatever a
    # server's GPUs.
    assert needs["big"] == needs["one"] == ServiceNeed(10, 10)
    assert replicas_for(0.5 * 8.0, 0.99, 1) == 10
    # A pool of 12 GPUs: each replica of "big" takes 4 of them.
    cut = service_needs({"big": big, "one": one}, histories, loads, 0.0, 60.0, config, capacity=12)
    assert (cut["big"].warm, cut["one"].warm) == (2, 4)


def test_the_idle_pool_of_multi_gpu_services_counts_replicas() -> None:
    config = SloConfig(enabled=True)
    relaxed = ServiceSpec("big", "m", cold_start_s=2.0, slo_wait_s=30.0, gpus_per_replica=4)
    histories = {"big": _history(1.0)}
    loads = {"big": ServiceLoad(rate=1.0, duration_s=4.0)}
    services = {"big": relaxed}
    assert idle_need(services, histories, loads, 60.0, config) == 0  # no one-GPU service
    want = idle_need({"big": ServiceSpec("big", "m", cold_start_s=2.0, slo_wait_s=30.0)},
                     histories, loads, 60.0, config)  # fmt: skip
    assert want == 7
    assert idle_need_multi(services, histories, loads, 60.0, config) == {4: 7}
    serving = {"big": 1}  # replicas serving now are servers of the pool already
    assert idle_need_multi(services, histories, loads, 60.0, config, serving=serving) == {4: 6}


def test_the_guard_holds_idle_node_sets() -> None:
    gpus = [inf(g, GpuState.FREE) for g in NODE1]
    gpus += [inf(g, GpuState.FREE) for g in NODE2[:2]]
    gpus += [inf(g, GpuState.LENT, job="j") for g in NODE2[2:]]
    jobs = (jobview("j", (0, 0, 2, 2)),)
    gpus = [GpuView(0, i, Pool.TRAINING, GpuState.TRAINING, job="j") for i in range(2)] + gpus
    gpus += [GpuView(0, i, Pool.TRAINING, GpuState.FREE) for i in (2, 3)]
    out = guard({}, gpus, jobs, {"big": BIG}, CLUSTER, 0.0, 60.0, idle_sets={4: 2})
    assert out.held == frozenset(NODE1 + NODE2)
    assert sorted(op.gpu for op in out.ops if isinstance(op, Reclaim)) == [(2, 2), (2, 3)]


def test_a_prewarm_never_reuses_a_replica_on_the_training_pool() -> None:
    # A sleeping replica of "big" on the training node (ATS-I may start one on FREE
    # training GPUs): the guard's pre-warm is on the inference pool only.
    train = tuple((0, i) for i in range(4))
    gpus = [GpuView(*g, Pool.TRAINING, GpuState.SLEEP, service="big", replica_gpus=train)
            for g in train]  # fmt: skip
    gpus += [inf(g, GpuState.FREE) for g in NODE1 + NODE2]
    out = guard({"big": ServiceNeed(1, 1)}, gpus, (), {"big": BIG}, CLUSTER, 0.0, 60.0)
    assert out.ops == (WarmReplica((1, 0), "big", 120.0, NODE1),)
