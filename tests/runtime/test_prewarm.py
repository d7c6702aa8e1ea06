"""SLO-guarded lending on the runtime (``deepboot up --slo``), in-process with fake
actors and a recording router (no Ray, no sockets): a ``WarmReplica`` starts a replica
with no request, durable in the event log first; its load, reported by the router,
becomes REPLICA_WARM (it took no request) or leaves it serving (requests joined it);
every request the router accepts feeds the guard's binned arrival history; and a tick
pre-warms a service's ``guaranteed_replicas`` through the shared control loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from deepboot.core.cluster import ClusterSpec, Node, Pool  # noqa: E402
from deepboot.core.gpu import GpuState  # noqa: E402
from deepboot.core.service import ServiceSpec  # noqa: E402
from deepboot.policies.forecast import ArrivalHistory  # noqa: E402
from deepboot.policies.lending import ServiceLoad  # noqa: E402
from deepboot.runtime import messages as rt  # noqa: E402
from deepboot.runtime.client.replay import replay_state  # noqa: E402
from deepboot.runtime.controller.controller_settings import ControllerSettings  # noqa: E402
from deepboot.runtime.controller.jobrecords import parse_gpu  # noqa: E402
from deepboot.runtime.controller.service_catalog import planned_spec  # noqa: E402
from deepboot.runtime.controller.wiring import Controller  # noqa: E402
from deepboot.runtime.store.jobstore import LogKind  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from deepboot.scheduler.control import ReplicaLoad, Step  # noqa: E402
from deepboot.scheduler.events import Event, EventKind  # noqa: E402
from deepboot.scheduler.operations import WarmReplica  # noqa: E402
from deepboot.world.settings import SharedCluster  # noqa: E402
from tests.runtime.fake_actors import FakeActors  # noqa: E402
from tests.runtime.test_controller_inprocess import Clock  # noqa: E402

CLUSTER = ClusterSpec((Node(0, 2, Pool.TRAINING), Node(1, 2, Pool.INFERENCE)))
GPU = (1, 0)
UNTIL = 1100.0


class RecordingRouter:
    """The router's side the controller calls, recorded (nothing is served)."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str, str, bool, str]] = []  # gpu, service, name, cold, task
        self.stopped: list[str] = []

    def start_replica(
        self, gpu: str, service: str, name: str, handle: Any, cold: bool, task: str = ""
    ) -> None:
        self.started.append((gpu, service, name, cold, task))

    def stop_replica(self, gpu: str) -> None:
        self.stopped.append(gpu)

    def set_services(self, specs: Any, cold: Any = None) -> None:
        pass

    def beat(self) -> None:
        pass


class DurableFirst(FakeActors):
    """Fake actors that check, when a replica's actor is created, that the event log
    already holds its start (intent recorded before acting)."""

    ctl: Controller | None = None

    def create_replica(
        self,
        name: str,
        spec: dict[str, Any],
        gpu: str,
        log_path: str,
        more_gpus: tuple[str, ...] = (),
    ) -> Any:
        assert self.ctl is not None
        starts = [e.detail for e in self.ctl.store.events() if e.kind is LogKind.REPLICA]
        assert starts and starts[-1]["gpu"] == gpu and starts[-1]["op"] == "start"
        return super().create_replica(name, spec, gpu, log_path, more_gpus)


class Crashed(Exception):
    """The controller died at its crash point (in-process)."""


def _crash(point: str) -> None:
    raise Crashed(point)


def controller(
    tmp_path: Path,
    shared: SharedCluster | None = None,
    crash_at: str = "",
    fake: DurableFirst | None = None,
    **service: Any,
) -> tuple[Controller, DurableFirst, RecordingRouter]:
    fake = fake or DurableFirst()
    settings = ControllerSettings(
        policy="fifo", interval=60.0, shared=shared or SharedCluster(slo=True), crash_at=crash_at
    )
    state = StateDir.at(tmp_path / "state").ensure()
    ctl = Controller(state, settings, CLUSTER, fake, clock=Clock(), crash=_crash)
    fake.ctl = ctl
    ctl.start()  # posts the first tick (not run yet)
    router = RecordingRouter()
    ctl.router.port = router  # type: ignore[assignment]
    spec = {"cold_start_s": 5.0, "slo_wait_s": 1.0, **service}
    ctl.store.register_service(ServiceSpec("svc", "tiny", handler="m:load", **spec))
    ctl.catalog.take_services()
    return ctl, fake, router


def replica_log(ctl: Controller) -> list[dict[str, object]]:
    return [e.detail for e in ctl.store.events() if e.kind is LogKind.REPLICA]


def warm(ctl: Controller) -> str:
    """Apply a WarmReplica of svc on GPU; the new actor's name."""
    ctl.backend.apply(Step(ops=(WarmReplica(GPU, "svc", UNTIL),)))
    name = ctl.board.get(GPU).replica
    assert name is not None
    return name


def test_a_warm_replica_starts_an_actor_with_no_request_logged_first(tmp_path: Path) -> None:
    ctl, fake, router = controller(tmp_path)
    name = warm(ctl)
    gpu = ctl.board.get(GPU)
    assert (gpu.state, gpu.service) == (GpuState.RUNNING, "svc")
    assert fake.replicas == {name: "1.0"}
    assert router.started == [("1.0", "svc", name, True, "")]  # a new replica, no task
    [start] = replica_log(ctl)
    assert start == {"gpu": "1.0", "service": "svc", "op": "start", "cold": True, "prewarm": True}
    # While it loads the loop sees it as full: the router fills its slots itself.
    snap = ctl.backend.snapshot(Event(EventKind.INFERENCE_ARRIVAL, "r1", "svc"))
    assert dict(snap.replicas) == {GPU: ReplicaLoad(1, 1000.0 + 5.0)}


@pytest.mark.parametrize(
    ("inflight", "state", "until"),
    [(0, GpuState.PROTECT, UNTIL), (1, GpuState.SLEEP, None)],
    ids=["took-none:replica-warm", "took-requests:inference-done"],
)
def test_a_pre_warmed_replica_once_loaded(
    tmp_path: Path, inflight: int, state: GpuState, until: float | None
) -> None:
    """Loaded with no request (the router's Ready, then its Idle), it is protected
    until its ``WarmReplica``'s ``until`` (REPLICA_WARM); loaded with requests that
    joined it while it loaded, it serves them, and its Idle is an INFERENCE_DONE (with
    ``--slo``: asleep at once, the next tick's guard decides)."""
    ctl, _, _ = controller(tmp_path)
    name = warm(ctl)
    ctl.inbox.put(rt.Ready("1.0", name, 2.0, 1.5, "cold", inflight=inflight))
    ctl.intake.handle_messages()
    ctl.driver.run_due()  # the first tick: the replica loading is the service's
    assert ctl.board.get(GPU).state is GpuState.RUNNING
    assert bool(ctl.replicas.prewarming()) is not bool(inflight)
    ctl.inbox.put(rt.Idle("1.0", name))
    ctl.intake.handle_messages()
    assert not ctl.replicas.prewarming()
    assert not ctl.backend.snapshot(Event(EventKind.RETRY)).replicas
    ctl.driver.run_due()
    gpu = ctl.board.get(GPU)
    assert (gpu.state, gpu.replica, gpu.protect_until) == (state, name, until)
    ctl.flush()
    assert [d["op"] for d in replica_log(ctl)] == ["start", "ready"] + ["sleep"] * inflight
    assert not [e for e in ctl.store.events() if e.kind is LogKind.DECISION_REJECTED]


def test_the_tick_snapshot_carries_every_request_the_router_accepted_binned(
    tmp_path: Path,
) -> None:
    ctl, _, _ = controller(tmp_path)
    clock = ctl.clock
    assert isinstance(clock, Clock)
    # Bins of 60 s aligned to time 0: 960-1020 gets two requests, 1020-1080 one,
    # 1080-1140 (in progress at 1090) one, left out of the history.
    for t in (1000.0, 1010.0, 1030.0, 1090.0):
        clock.t = t
        ctl.inbox.put(rt.Received("svc"))
        ctl.inbox.put(rt.Served("svc", 0.5))
        ctl.intake.handle_messages()
    snap = ctl.backend.snapshot(Event(EventKind.TICK))
    # Each one-second window held one request: squares 1 + 1 and 1, busiest second 1.
    expected = ArrivalHistory(60.0, (2, 1), 1080.0, squares=(2, 1), peaks=(1, 1))
    assert dict(snap.arrivals) == {"svc": expected}
    assert dict(snap.loads) == {"svc": ServiceLoad(0.0, 0.5)}
    # Only a round reads them (as the simulator's ticks); without --slo nothing is kept.
    assert not ctl.backend.snapshot(Event(EventKind.INFERENCE_ARRIVAL, "r", "svc")).arrivals
    off, _, _ = controller(tmp_path / "off", SharedCluster())
    off.inbox.put(rt.Received("svc"))
    off.intake.handle_messages()
    assert (
        off.requests.arrivals is None and not off.backend.snapshot(Event(EventKind.TICK)).arrivals
    )


@pytest.mark.parametrize(
    ("shared", "service"),
    [
        (SharedCluster(slo=True), {"guaranteed_replicas": 1}),
        (SharedCluster(), {"guaranteed_replicas": 1}),
    ],
    ids=["slo", "guaranteed-without-slo"],
)
def test_a_tick_pre_warms_a_guaranteed_replica_through_the_loop(
    tmp_path: Path, shared: SharedCluster, service: dict[str, Any]
) -> None:
    """A service with no history yet needs its ``guaranteed_replicas``: the first tick's
    guard pre-warms one (``guaranteed_replicas`` holds under every policy, ``--slo``
    or not, so the runtime had to apply it either way)."""
    ctl, fake, router = controller(tmp_path, shared, **service)
    ctl.driver.run_due()  # the first tick
    assert not [e for e in ctl.store.events() if e.kind is LogKind.DECISION_REJECTED]
    [(gpu, svc, name, cold, task)] = router.started
    assert (svc, cold, task) == ("svc", True, "")
    assert fake.replicas == {name: gpu}
    assert [d.get("prewarm") for d in replica_log(ctl)] == [True]
    # Loaded and idle: REPLICA_WARM protects it; the next tick holds it, starts none.
    ctl.inbox.put(rt.Ready(gpu, name, 2.0, 1.5, "cold"))
    ctl.inbox.put(rt.Idle(gpu, name))
    ctl.intake.handle_messages()
    ctl.driver.run_due()
    assert ctl.board.get(parse_gpu(gpu)).state is GpuState.PROTECT
    ctl.driver.post(Event(EventKind.TICK))
    ctl.driver.run_due()
    assert len(router.started) == 1


def test_a_controller_killed_between_a_pre_warms_row_and_its_actor_loses_nothing(
    tmp_path: Path,
) -> None:
    """``cold.recorded`` on a pre-warm: the row names a replica no actor runs; the next
    controller finds the GPU FREE, and its first tick pre-warms the replica again."""
    first, fake, _ = controller(tmp_path, crash_at="cold.recorded", guaranteed_replicas=1)
    with pytest.raises(Crashed):
        warm(first)
    first.store.close()
    assert not fake.replicas
    ctl, _, router = controller(tmp_path, fake=fake, guaranteed_replicas=1)
    assert ctl.board.get(GPU).state is GpuState.FREE
    ctl.driver.run_due()  # the first tick
    [(_, svc, name, _, task)] = router.started
    assert (svc, task) == ("svc", "") and name in fake.replicas


def test_a_run_with_pre_warms_and_arrivals_replays_with_no_divergence(tmp_path: Path) -> None:
    """The recording holds what the guard read (``arrivals``, the loading replicas)
    and decided (``WarmReplica``): ``deepboot replay`` decides the same, step by step."""
    ctl, _, router = controller(tmp_path, guaranteed_replicas=1)
    clock = ctl.clock
    assert isinstance(clock, Clock)
    ctl.driver.run_due()  # the first tick pre-warms the guaranteed replica
    for _minute in range(4):  # four minutes of steady requests, a tick each minute
        for _ in range(6):
            clock.t += 10.0
            ctl.inbox.put(rt.Received("svc"))
            ctl.inbox.put(rt.Served("svc", 2.0))
            ctl.intake.handle_messages()
        ctl.driver.post(Event(EventKind.TICK))
        ctl.driver.run_due()
        assert ctl.backend.snapshot(Event(EventKind.TICK)).arrivals["svc"].counts
    # The guaranteed replica, then one more for the load the forecast sees, both
    # pre-warmed with no request.
    assert [(gpu, task) for gpu, _, _, _, task in router.started] == [("1.0", ""), ("1.1", "")]
    assert not [e for e in ctl.store.events() if e.kind is LogKind.DECISION_REJECTED]
    ctl.recorder.close()
    result = replay_state(StateDir.at(tmp_path / "state"))
    assert result.divergence is None and result.steps >= 5


def test_a_service_with_no_cold_start_on_file_is_planned_with_the_measured_one(
    tmp_path: Path,
) -> None:
    """Without it the guard saw a 0 s cold start and took the relaxed regime: it
    reclaimed GPUs ahead of demand but never pre-warmed on them."""
    ctl, _, _ = controller(tmp_path, cold_start_s=None, slo_wait_s=3.0)
    assert ctl.catalog.specs["svc"].cold_start_s is None
    name = warm(ctl)
    # Ready: 17.5 s from start to ready, 12 s of it the handler's load.
    ctl.inbox.put(rt.Ready("1.0", name, 17.5, 12.0, "cold", inflight=0))
    ctl.intake.handle_messages()
    assert ctl.catalog.specs["svc"].cold_start_s == 17.5  # what a request would have waited
    ctl.flush()
    # A restarted controller plans with the store's measurement (the load alone)
    # until its own next replica measures start to ready.
    row = next(r for r in ctl.store.services() if r.spec.name == "svc")
    assert row.cold_start == 12.0
    assert planned_spec(row.spec, row.cold_start).cold_start_s == 12.0
    assert planned_spec(row.spec, None).cold_start_s is None  # nothing measured yet
    # A cold start on file is never replaced.
    fixed, _, _ = controller(tmp_path / "fixed", cold_start_s=5.0)
    fixed_name = warm(fixed)
    fixed.inbox.put(rt.Ready("1.0", fixed_name, 17.5, 12.0, "cold", inflight=0))
    fixed.intake.handle_messages()
    assert fixed.catalog.specs["svc"].cold_start_s == 5.0
