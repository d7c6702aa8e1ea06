"""Inference replicas as the controller runs them: a task's replica woken warm or
started new (an actor per replica, named by service, GPU and incarnation), a replica
pre-warmed with no task (``WarmReplica``, ``--slo``), evicted ones exported into their
node's model cache (``--host-cache-gb``) and killed; the ledger has the GPU's state,
the router the replica's requests.

Each replica's record (:mod:`~deepboot.runtime.controller.replicarecords`) is kept
here; the node-local model caches are :mod:`~deepboot.runtime.controller.hostcaches`'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.gpu import GpuId, GpuState
from deepboot.runtime.actors.handles import Actors
from deepboot.runtime.actors.replica_actor import STANDBY_CONCURRENCY, replica_name, standby_name
from deepboot.runtime.controller.controller_settings import ControllerSettings
from deepboot.runtime.controller.eventlog import EventLog
from deepboot.runtime.controller.faults import CrashPoints
from deepboot.runtime.controller.hostcaches import HostCaches
from deepboot.runtime.controller.jobrecords import gpu_name, parse_gpu
from deepboot.runtime.controller.replicarecords import ReplicaPhase, ReplicaRec
from deepboot.runtime.controller.service_catalog import ServiceCatalog
from deepboot.runtime.controller.shared import Flush, Incarnations, Requests, RouterLink
from deepboot.runtime.store.jobstore import LogKind
from deepboot.runtime.store.statedir import StateDir
from deepboot.scheduler.control import ReplicaLoad
from deepboot.scheduler.operations import StartReplica, WarmReplica
from deepboot.world.gpus import GpuBoard, apply_gpu_op

log = logging.getLogger("deepboot.controller")

_NO_REPLICAS: Mapping[GpuId, ReplicaLoad] = MappingProxyType({})
_NO_SLEEPERS: Mapping[tuple[GpuId, ...] | GpuId, str] = MappingProxyType({})

SLEEP_MARGIN_S = 5.0
"""What the controller waits for a sleep beyond the service's ``sleep.timeout_s`` (the
replica's own call to its server is bounded by that; this bounds the actor)."""

STANDBY_CALL_TIMEOUT_S = 2.0
"""Longest wait for a ready standby to take its service (a call that returns at once:
a longer one means its process is in trouble; then a new replica starts instead)."""


@dataclass(frozen=True, slots=True)
class Sleeper:
    """A command replica asleep: its actor, its service and its GPUs (lead first)."""

    name: str
    service: str
    gpus: tuple[GpuId, ...]


class Replicas:
    """Replica actors around the ledger's replica operations, the standbys and the
    node-local model caches.

    Args:
        board: The GPU ledger: every replica's GPU.
        catalog: The services (their specs).
        requests: The requests waiting for the loop (a placed one stops waiting).
        state: The state directory (the services' logs).
        settings: The controller's settings (standbys, the cache's size, timeouts).
        cluster: The cluster (its inference nodes).
        actors: The replicas', standbys' and caches' processes.
        router: The router, told of every replica started or stopped.
        log: The event log.
        flush: Makes a new replica's row durable before its actor exists.
        crash: The crash points.
        incarnations: The actor names' counters.
        clock: Wall clock.
        caches: The node-local model caches (an evicted replica's model goes there).

    Attributes:
        on_gpu: The record (:class:`~deepboot.runtime.controller.replicarecords.ReplicaRec`)
            of the replica last started, or recovered, on each GPU; a record whose
            name is not the ledger's replica there is of one gone (evicted, dead).
        standbys: With --standby-replicas: node -> its standby's actor name (not yet
            promoted).
        sleepers: Command replicas asleep (their server keeps its weights in host
            memory; their GPUs are lent or free), by their lead GPU. A new replica of
            that service on those very GPUs wakes it instead of a cold start; a new
            replica on any of them otherwise ends it first.
    """

    def __init__(
        self,
        board: GpuBoard,
        catalog: ServiceCatalog,
        requests: Requests,
        state: StateDir,
        settings: ControllerSettings,
        cluster: ClusterSpec,
        actors: Actors,
        router: RouterLink,
        log: EventLog,
        flush: Flush,
        crash: CrashPoints,
        incarnations: Incarnations,
        clock: Callable[[], float],
        caches: HostCaches,
    ) -> None:
        self.board, self.catalog, self.requests, self.state = board, catalog, requests, state
        self.settings, self.cluster, self.actors, self.router = settings, cluster, actors, router
        self.log, self.flush, self.crash = log, flush, crash
        self.incarnations, self.clock, self.caches = incarnations, clock, caches
        self.on_gpu: dict[GpuId, ReplicaRec] = {}
        self.standbys: dict[int, str] = {}
        self.sleepers: dict[GpuId, Sleeper] = {}

    def start_replica(self, op: StartReplica) -> None:
        """A task's replica on ``op.gpu``: the idle one of its service there, woken
        (warm), or a new actor (cold; one of another service there is killed first)."""
        rec = self.board.get(op.gpu)
        self.requests.placed(op.task)
        replica, service = rec.replica, rec.service
        warm = not op.cold and replica is not None and service == op.service
        if not warm and replica is not None:
            self.replica_gone(op.gpu, replica, service, gpus=rec.replica_gpus)
        apply_gpu_op(self.board, op)
        gpu = gpu_name(op.gpu)
        if warm:
            assert replica is not None
            self._name_replica(op.gpus or (op.gpu,), replica)
            if self.router.port is not None:
                handle = self.actors.handle(replica)
                self.router.start_replica(
                    gpu, op.service, replica, handle, cold=False, task=op.task
                )
            # A warm reuse is not logged: in a lull it happens at every request.
            return
        self._new_replica(op.gpus or (op.gpu,), op.service, op.task)

    def warm_replica(self, op: WarmReplica) -> None:
        """Pre-warm a replica of ``op.service`` on ``op.gpu`` (FREE: the ledger checks
        it) with no request: a new actor, logged as a replica ``start`` with
        ``prewarm: true``. The router queues the service's next requests on it while
        it loads; once it has loaded and taken none, the controller posts REPLICA_WARM
        with ``op.until`` (:mod:`~deepboot.runtime.controller.intake`).

        Raises:
            InvalidDecisionError: the GPU is not FREE (nothing was started).
        """
        apply_gpu_op(self.board, op)
        self._new_replica(op.gpus or (op.gpu,), op.service, task="", warm_until=op.until)

    def _name_replica(self, gpus: tuple[GpuId, ...], name: str) -> None:
        """Every GPU of a replica names its actor (a k-GPU replica on each of its k)."""
        for g in gpus:
            self.board.get(g).replica = name

    def sleeping(self) -> Mapping[tuple[GpuId, ...] | GpuId, str]:
        """The snapshot's ``sleeping``: each sleeping server's GPUs -> its service
        (ATS-I wakes a server on its own GPUs first)."""
        if not self.sleepers:
            return _NO_SLEEPERS
        return MappingProxyType({s.gpus: s.service for s in self.sleepers.values()})

    def _new_replica(
        self,
        gpus: tuple[GpuId, ...],
        service: str,
        task: str,
        warm_until: float | None = None,
    ) -> str:
        """Start a new replica of ``service`` on ``gpus`` (lead first; already RUNNING
        on the ledger) for request ``task`` ("": pre-warmed with ``warm_until``, none)
        and tell the router; returns the actor's name, whose record is LOADING (or
        PREWARMING). A sleeping server of the service on these GPUs is woken; else the
        node's standby becomes it when there is one (``--standby-replicas``), else a
        new actor.

        A new actor's log row is durable before the actor exists: a controller that
        dies in between finds a row naming a replica that is not there (the GPU comes
        back FREE), never a live replica no row names. A standby is promoted before
        its row: one that dies in between finds a live promoted standby that no row
        names, which recovery kills (as it kills every standby no row names)."""
        gpu_id = gpus[0]
        gpu = gpu_name(gpu_id)
        spec = self.catalog.specs[service]
        log_path = str(self.state.logs / f"service-{service}.log")
        extra: dict[str, Any] = {} if task else {"prewarm": True}
        if len(gpus) > 1:
            extra["gpus"] = [gpu_name(g) for g in gpus]
        asleep = self.sleepers.get(gpu_id)
        if asleep is not None and (asleep.service, asleep.gpus) == (service, gpus):
            del self.sleepers[gpu_id]
        else:
            asleep = None
            self._end_sleepers(gpus)
        promoted = None
        if asleep is None and not spec.is_command:  # a standby imports a handler's world
            promoted = self._promote_standby(gpu_id, spec.to_json(), spec.concurrency, log_path)
        if asleep is not None:
            # Its own server, asleep on these GPUs: the router's load wakes it (its
            # ``wake`` call: a host start), or restarts it cold should the wake fail.
            name = asleep.name
            self._name_replica(gpus, name)
            self.log.note(LogKind.REPLICA, gpu=gpu, service=service, op="start", cold=True,
                          wake=True, **extra)  # fmt: skip
            self.flush()
            handle = self.actors.handle(name)
        elif promoted is not None:
            name, handle = promoted
            self.crash.hit("standby.promoted")
            self._name_replica(gpus, name)
            self.log.note(LogKind.REPLICA, gpu=gpu, service=service, op="start", cold=True,
                      standby=True, **extra)  # fmt: skip
            self.flush()
        else:
            name = replica_name(service, gpu, self.incarnations.next(f"replica:{service}"))
            self._name_replica(gpus, name)
            self.log.note(LogKind.REPLICA, gpu=gpu, service=service, op="start", cold=True, **extra)
            self.flush()
            self.crash.hit("cold.recorded")
            more = tuple(gpu_name(g) for g in gpus[1:])
            handle = self.actors.create_replica(name, spec.to_json(), gpu, log_path, more)
        phase = ReplicaPhase.LOADING if warm_until is None else ReplicaPhase.PREWARMING
        self.on_gpu[gpu_id] = ReplicaRec(name, service, phase, self.clock(), warm_until)
        self.router.start_replica(gpu, service, name, handle, cold=True, task=task)
        return name

    # -- the replicas' records -------------------------------------------------------------

    def record(self, gpu_id: GpuId, replica: str | None) -> ReplicaRec | None:
        """The record of ``replica`` on ``gpu_id`` (None: another one's, or none)."""
        r = self.on_gpu.get(gpu_id)
        return r if r is not None and replica is not None and r.name == replica else None

    def adopt(self, gpu_id: GpuId, replica: str, service: str) -> None:
        """A live replica a restarted controller kept: loaded (it was idle)."""
        self.on_gpu[gpu_id] = ReplicaRec(replica, service, ReplicaPhase.READY, self.clock())

    def loaded(self, gpu_id: GpuId, replica: str, inflight: int) -> None:
        """The router reported ``replica`` Ready: a pre-warmed one that requests
        joined while it loaded serves them (READY), one with none waits for its Idle
        (WARM_IDLE: :meth:`emptied_prewarm`)."""
        r = self.record(gpu_id, replica)
        if r is None or r.loaded:
            return
        if r.phase is ReplicaPhase.PREWARMING and not inflight:
            r.move(ReplicaPhase.WARM_IDLE)
        else:
            r.move(ReplicaPhase.READY)

    def emptied_prewarm(self, gpu_id: GpuId, replica: str | None) -> ReplicaRec | None:
        """The router reported ``replica`` idle: if it is a pre-warmed one that took
        no request, its record, moved on (its REPLICA_WARM is the caller's); else None."""
        r = self.record(gpu_id, replica)
        if r is None or not r.prewarm_pending:
            return None
        r.move(ReplicaPhase.READY if r.loaded else ReplicaPhase.LOADING)
        return r

    def prewarming(self) -> list[ReplicaRec]:
        """The pre-warmed replicas not yet protected by their REPLICA_WARM nor serving."""
        return [r for r in self.on_gpu.values() if r.prewarm_pending]

    def is_loading(self, gpu_id: GpuId, replica: str | None) -> bool:
        """``replica`` on ``gpu_id`` has not reported Ready (``Snapshot.loading``);
        False when the GPU has no replica."""
        if replica is None:
            return False
        r = self.record(gpu_id, replica)
        return r is None or not r.loaded

    def first_sleep(self, gpu_id: GpuId, replica: str, service: str | None) -> bool:
        """``replica`` goes to sleep: True the first time (its sleep is logged once:
        with --slo a replica sleeps after every request, and warm reuses are not
        logged, so a second ``sleep`` of the same replica says nothing new)."""
        r = self.record(gpu_id, replica)
        if r is None:  # one this controller never started nor kept: loaded, surely
            r = self.on_gpu[gpu_id] = ReplicaRec(
                replica, service or "", ReplicaPhase.READY, self.clock()
            )
        if r.sleep_logged:
            return False
        r.sleep_logged = True
        return True

    # -- standby replicas (--standby-replicas) -----------------------------------------------

    def start_standbys(self) -> None:
        """A standby on every inference node that has none (``--standby-replicas``;
        nothing without). Never waits: each imports in its own process, and is used
        once it answers (:meth:`Actors.standby_ready`)."""
        if not self.settings.standby_replicas:
            return
        for node in self.cluster.pool_nodes(Pool.INFERENCE):
            if node.node_id in self.standbys:
                continue
            name = standby_name(node.node_id, self.incarnations.next(f"standby:{node.node_id}"))
            try:
                self.actors.create_standby(
                    name, node.node_id, str(self.state.logs / f"standby-{node.node_id}.log")
                )
            except Exception as exc:  # noqa: BLE001 (without one, replicas start as before)
                log.warning("could not start node %d's standby: %s", node.node_id, exc)
                continue
            self.standbys[node.node_id] = name

    def _promote_standby(
        self, gpu_id: GpuId, spec: dict[str, Any], concurrency: int, log_path: str
    ) -> tuple[str, Any] | None:
        """The node's standby made a replica of ``spec`` on ``gpu_id``: its name and
        handle; None when there is none ready (off, still importing, or too few call
        slots for the service), or it failed (killed; the caller starts a new actor).
        The next standby starts once this one's replica is ready (``start_standbys``
        from the router's Ready): not now, when it would take the CPU from this load."""
        name = self.standbys.get(gpu_id[0])
        if name is None or concurrency + 1 > STANDBY_CONCURRENCY:
            return None
        if not self.actors.standby_ready(name):
            return None
        del self.standbys[gpu_id[0]]
        try:
            handle = self.actors.promote(name, spec, gpu_name(gpu_id), log_path,
                                         STANDBY_CALL_TIMEOUT_S)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 (a new actor instead: never an error)
            log.warning("standby %s could not be promoted (%s: %s); a new replica instead",
                        name, type(exc).__name__, exc)  # fmt: skip
            self.actors.kill(name)
            return None
        return name, handle

    def warming_loads(self) -> Mapping[GpuId, ReplicaLoad]:
        """The snapshot's ``replicas``: each pre-warmed replica still loading, as full
        (``in_flight`` = its service's ``concurrency``). The router, not the loop,
        fills its slots: a request of its service that arrives while it loads queues
        on it, and only one it has no room for reaches the loop as an arrival, which
        must then not join it. ``ready_at`` is an estimate (its start plus the
        service's ``cold_start_s``): the loop reads it only for a replica with room."""
        warming = {g: r for g, r in self.on_gpu.items() if r.prewarm_pending}
        if not warming:
            return _NO_REPLICAS
        out: dict[GpuId, ReplicaLoad] = {}
        for gpu_id, w in sorted(warming.items()):
            rec = self.board.get(gpu_id)
            spec = self.catalog.specs.get(w.service)
            if rec.replica != w.name or rec.state is not GpuState.RUNNING or spec is None:
                continue  # gone since (died, evicted): not loading any more
            out[gpu_id] = ReplicaLoad(spec.concurrency, w.started + (spec.cold_start_s or 0.0))
        return MappingProxyType(out)

    def replica_gone(
        self,
        gpu: GpuId,
        replica: str | None,
        service: str | None,
        sleep: bool = False,
        gpus: tuple[GpuId, ...] = (),
    ) -> None:
        """The replica ``replica`` that was on ``gpu`` is evicted: export its model
        into its node's cache (with ``--host-cache-gb``; a bounded wait), kill its
        actor and tell the router (the ledger has moved the GPU already).

        With ``sleep`` (its GPU leaves serving: lent, or free) a command service that
        declares ``sleep`` and ``wake`` is asked to sleep instead (bounded by its
        ``sleep.timeout_s``): once it answered, its actor gives the GPU back and stays,
        a sleeper (:attr:`sleepers`); a sleep that fails or times out is logged and
        the replica evicted as any other. ``gpus``: all the replica's GPUs (lead
        first) when it spans several.

        The export changes no row and no process's life: a controller that dies
        during it finds the replica alive and its row as before the eviction (the
        eviction was not flushed), and the cache holding the model or not, both
        consistent (it holds only copies).
        """
        if replica is None:
            return
        spec = self.catalog.specs.get(service) if service else None
        if sleep and spec is not None and spec.sleep is not None:
            answer = self.actors.sleep_replica(replica, spec.sleep.timeout_s + SLEEP_MARGIN_S)
            self.router.stop_replica(gpu_name(gpu))
            if answer.get("ok"):
                self.sleepers[gpu] = Sleeper(replica, spec.name, gpus or (gpu,))
                self.log.note(LogKind.REPLICA, gpu=gpu_name(gpu), service=service, op="evict",
                              asleep=True, seconds=round(float(answer["seconds"]), 3))  # fmt: skip
                return
            log.warning("replica %s did not sleep (%s); evicted", replica, answer.get("error"))
            self.log.note(LogKind.REPLICA, gpu=gpu_name(gpu), service=service, op="sleep-failed",
                          error=str(answer.get("error", ""))[-500:])  # fmt: skip
        cache = self.caches.export(gpu, replica, service)
        if cache:
            self.crash.hit("evict.exported")
        self.actors.kill(replica)
        self.crash.hit("evict.killed")
        self.router.stop_replica(gpu_name(gpu))
        extra = {"cache": cache} if cache else {}
        self.log.note(LogKind.REPLICA, gpu=gpu_name(gpu), service=service, op="evict", **extra)

    def node_left(self, node: int) -> None:
        """Node ``node`` left the cluster: its standby, its sleepers and its model
        cache died with it (another of each once it returns)."""
        self.standbys.pop(node, None)
        for gpu in [g for g in self.sleepers if g[0] == node]:
            del self.sleepers[gpu]
        self.caches.node_left(node)

    def reserved_gb(self, gpu: str) -> float:
        """GPU memory a sleeping server still holds on ``gpu`` ("node.index"): its
        service's ``sleep_gpu_gb``; 0 when none sleeps there. A training worker
        started there learns it (``WorkerConfig.gpu_reserved_gb``)."""
        gpu_id = parse_gpu(gpu)
        for s in self.sleepers.values():
            spec = self.catalog.specs.get(s.service)
            if gpu_id in s.gpus and spec is not None:
                return float(spec.sleep_gpu_gb)
        return 0.0

    def _end_sleepers(self, gpus: tuple[GpuId, ...]) -> None:
        """End every sleeping server on any of ``gpus`` (a new replica takes them: a
        sleeper's leftover GPU memory would be in its way); their weights leave host
        memory."""
        taken = set(gpus)
        for lead, s in list(self.sleepers.items()):
            if taken & set(s.gpus):
                del self.sleepers[lead]
                self.actors.kill(s.name)
                self.log.note(LogKind.REPLICA, gpu=gpu_name(lead), service=s.service,
                              op="evict", asleep=True)  # fmt: skip
