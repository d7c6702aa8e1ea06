"""Inference tasks in the simulator: what happened to each, the queue, recent load.

The simulator's record of the inference side, and nothing more: each service's spec
(:func:`service_specs`), where each task runs and when it starts and ends, the FIFO
queue of tasks that found no GPU, each service's recent arrivals and run times (for
the lending reserve), and, for services whose replicas serve several tasks at once
(``concurrency > 1``) and for pre-warmed replicas still loading (any concurrency),
what each of those RUNNING replicas serves. Where a task goes, and every replica's
lifecycle, is decided by the control loop (:mod:`deepboot.scheduler.control`); the
engine applies its operations and tells this ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from deepboot.core.errors import ConfigError
from deepboot.core.gpu import GpuId
from deepboot.core.jobs import InferenceTaskSpec
from deepboot.core.service import ServiceSpec
from deepboot.policies.lending import ServiceLoad
from deepboot.scheduler.control import PendingTask, ReplicaLoad
from deepboot.scheduler.events import Event, EventKind
from deepboot.sim.metrics import InferenceRecord
from deepboot.world.demand import DemandLedger, LoadWindow
from deepboot.world.hostcache import HostCache


def service_specs(
    tasks: Sequence[InferenceTaskSpec],
    cold_start_of: Callable[[str], float],
    given: Sequence[ServiceSpec] = (),
) -> Mapping[str, ServiceSpec]:
    """One spec per service of ``tasks``, in order of first arrival.

    Without ``given``: its model, the cold start of that model (``cold_start_of``),
    one task per replica, no replica cap. With ``given`` (a services file's specs):
    the spec of that name, as written.

    Raises:
        ConfigError: a service's tasks name two models, a service id is not a valid
            service name (letters, digits, ``_.-``; at most 63 characters), or a
            service is missing from ``given`` or has no cold start there.
    """
    named = {s.name: s for s in given}
    specs: dict[str, ServiceSpec] = {}
    for t in tasks:
        spec = specs.get(t.service)
        if spec is None:
            if named:
                spec = named.get(t.service)
                if spec is None or spec.cold_start_s is None:
                    why = "has no cold_start_s" if spec else "is not among the workload's services"
                    raise ConfigError(f"inference task {t.name!r}: service {t.service!r} {why}")
            else:
                try:
                    spec = ServiceSpec(t.service, t.model, cold_start_s=cold_start_of(t.model))
                except ConfigError as exc:
                    raise ConfigError(f"inference task {t.name!r}: {exc}") from None
            specs[t.service] = spec
        elif spec.model != t.model:
            raise ConfigError(
                f"inference task {t.name!r}: service {t.service!r} runs model "
                f"{spec.model!r}, not {t.model!r}"
            )
    return MappingProxyType(specs)


class SimTask:
    """One inference task inside the simulator (mutable, private to ``deepboot.sim``).

    Attributes:
        spec: The task as submitted.
        gpu: Its GPU once placed.
        start: When it starts serving (after a cold start), once placed.
        end: When it ends, once placed.
        cold: Whether it needed a new replica.
        host: Its new replica started from the node's host-memory cache.
        done: Its end has been handled.
    """

    __slots__ = ("spec", "gpu", "start", "end", "cold", "host", "done")

    def __init__(self, spec: InferenceTaskSpec) -> None:
        self.spec = spec
        self.gpu: GpuId | None = None
        self.start: float | None = None
        self.end: float | None = None
        self.cold = False
        self.host = False
        self.done = False

    def record(self) -> InferenceRecord:
        s = self.spec
        return InferenceRecord(
            name=s.name,
            service=s.service,
            model=s.model,
            submit=s.submit_time,
            start=self.start,
            end=self.end if self.done else None,
            cold=self.cold,
            delay=None if self.start is None else self.start - s.submit_time,
            host=self.host,
        )


class Serving:
    """The inference side of one simulation run, as a ledger.

    Args:
        tasks: Every inference task, in arrival order.
        services: Every service of ``tasks``, by name (see :func:`service_specs`).

    Attributes:
        services: Service name -> spec (read-only).
        tasks: Name -> task.
        reclaim_times: Time of every GPU taken back from training.
        proactive_reclaim_times: Time of each reclaim made ahead of demand.
        finished: Tasks whose end has been handled.
    """

    def __init__(
        self, tasks: Sequence[InferenceTaskSpec], services: Mapping[str, ServiceSpec]
    ) -> None:
        self.services = services
        self.shared = any(s.concurrency > 1 for s in services.values())
        """Some service's replicas serve several tasks at once (then
        :meth:`replica_loads` says what each serves)."""
        self._replicas: dict[GpuId, ReplicaLoad] = {}
        self._replica_view: Mapping[GpuId, ReplicaLoad] | None = None
        # When each new replica finishes loading (a cold or host start, for a task
        # or a pre-warm), by GPU; entries past are dropped as :meth:`loading` reads.
        self._loaded_at: dict[GpuId, float] = {}
        self.tasks: dict[str, SimTask] = {t.name: SimTask(t) for t in tasks}
        self._order = [self.tasks[t.name] for t in tasks]
        self._waiting: dict[str, SimTask] = {}
        self._pending: tuple[PendingTask, ...] | None = ()
        self.window = LoadWindow()
        self.reclaim_times: list[float] = []
        self.demand: DemandLedger | None = None
        """Binned arrivals for the SLO guard's forecast (set when it is on)."""
        self.proactive_reclaim_times: list[float] = []
        """The subset of ``reclaim_times`` taken before the requests that need them
        arrived (``Reclaim.proactive``)."""
        self.finished = 0
        self.cache: HostCache | None = None
        """Each inference node's host-memory model cache (None: off)."""
        self._model_gb: dict[str, float] = {}
        self.host_start_s: Mapping[str, float] = MappingProxyType({})
        """Each service's host start, seconds (empty without a cache)."""

    def cache_models(self, cache: HostCache, catalog: Mapping[str, float]) -> None:
        """Keep evicted replicas' models in ``cache``; each service's size is its own
        ``model_gb``, else ``catalog``'s for its model.

        Raises:
            ConfigError: a service whose model's size is known to neither.
        """
        for name, spec in self.services.items():
            gb = spec.model_gb if spec.model_gb is not None else catalog.get(spec.model)
            if gb is None:
                raise ConfigError(
                    f"service {name!r}: the host cache needs its model's size: set model_gb "
                    f"in its services file (model {spec.model!r} is not in the catalog: "
                    f"{', '.join(sorted(catalog))}), or run without the cache: "
                    "--host-cache-gb 0 (the preset guarded sets 1)"
                )
            self._model_gb[name] = gb
        self.cache = cache
        if cache.config.preload:
            models: dict[str, float] = {}
            for name in sorted(self.services):
                models.setdefault(self.services[name].model, self._model_gb[name])
            cache.preload(models.items())
        self.host_start_s = MappingProxyType(
            {name: self._host_start(name) for name in self._model_gb}
        )

    def _host_start(self, service: str) -> float:
        """Seconds a new replica of ``service`` takes from its node's host cache: a
        replica of k GPUs copies its weights over k links at once (one per GPU, each
        ``gbps``), so a k-th of them each (one GPU: the whole model)."""
        assert self.cache is not None
        k = self.services[service].gpus_per_replica
        gb = self._model_gb[service]
        return self.cache.config.start_s(gb if k == 1 else gb / k)

    def evicted(self, gpu: GpuId, service: str) -> None:
        """The replica of ``service`` on ``gpu`` was evicted: its model stays in the
        node's host memory (when the cache is on)."""
        if self.cache is not None:
            self.cache.keep(gpu[0], self.services[service].model, self._model_gb[service])

    def _new_replica_s(self, gpu: GpuId, spec: ServiceSpec) -> tuple[float, bool]:
        """(seconds until a new replica of ``spec`` on ``gpu`` serves, from host?)."""
        cache = self.cache
        if cache is not None and cache.holds(gpu[0], spec.model):
            cache.use(gpu[0], spec.model)
            return self._host_start(spec.name), True
        assert spec.cold_start_s is not None  # set for every service (service_specs)
        return spec.cold_start_s, False

    def arrival_events(self) -> list[tuple[float, Event]]:
        """``(time, event)`` of every task's arrival, in arrival order."""
        return [
            (
                t.spec.submit_time,
                Event(EventKind.INFERENCE_ARRIVAL, t.spec.name, service=t.spec.service),
            )
            for t in self._order
        ]

    @property
    def all_done(self) -> bool:
        """Every task has finished."""
        return self.finished == len(self._order)

    def waiting(self) -> tuple[str, ...]:
        """Names of the tasks queued for a GPU, oldest first."""
        return tuple(self._waiting)

    def pending(self) -> tuple[PendingTask, ...]:
        """The queue as the control loop sees it, oldest first."""
        if self._pending is None:
            self._pending = tuple(
                PendingTask(t.spec.name, t.spec.service) for t in self._waiting.values()
            )
        return self._pending

    @property
    def reports_replicas(self) -> bool:
        """Whether :meth:`replica_loads` may name a replica: some service shares its
        replicas, or a pre-warmed replica is loading or serving."""
        return self.shared or bool(self._replicas)

    def replica_loads(self) -> Mapping[GpuId, ReplicaLoad]:
        """What each RUNNING replica of a service with ``concurrency > 1``, and each
        pre-warmed replica still loading or serving the tasks that joined it while it
        loaded, serves (read-only; ``Snapshot.replicas``)."""
        if self._replica_view is None:
            self._replica_view = MappingProxyType(dict(self._replicas))
        return self._replica_view

    def records(self) -> tuple[InferenceRecord, ...]:
        """One record per task, in arrival order."""
        return tuple(t.record() for t in self._order)

    # -- facts -----------------------------------------------------------------------

    def arrived(self, name: str, now: float) -> None:
        """Task ``name`` arrived at ``now`` (counted in its service's load)."""
        service = self.tasks[name].spec.service
        self.window.arrived(service, now)
        if self.demand is not None:
            self.demand.arrived(service, now)

    def enqueue(self, name: str) -> None:
        """Queue a task that found no GPU (a no-op when it is queued already)."""
        if name not in self._waiting:
            self._waiting[name] = self.tasks[name]
            self._pending = None

    def started(
        self, name: str, gpu: GpuId, cold: bool, now: float, joined: bool = False
    ) -> SimTask:
        """Task ``name`` is placed on ``gpu`` at ``now`` (it leaves the queue).

        It starts serving after its service's cold start when ``cold``; when it
        ``joined`` a RUNNING replica (a free slot, or a pre-warmed replica, whatever
        the service's concurrency), once that replica is loaded; else at once.
        """
        task = self.tasks[name]
        if self._waiting.pop(name, None) is not None:
            self._pending = None
        spec = self.services[task.spec.service]
        start = now
        if cold:
            seconds, task.host = self._new_replica_s(gpu, spec)
            start = now + seconds
            self._loaded_at[gpu] = start
        elif joined:
            start = max(now, self._replicas[gpu].ready_at)
        task.gpu = gpu
        task.cold = cold
        task.start = start
        task.end = start + task.spec.duration
        if spec.concurrency > 1 or joined:
            load = self._replicas.get(gpu) if joined else None
            self._replicas[gpu] = (
                ReplicaLoad(1, start)
                if load is None
                else ReplicaLoad(load.in_flight + 1, load.ready_at)
            )
            self._replica_view = None
        return task

    def warming(self, gpu: GpuId, service: str, now: float) -> float:
        """A replica of ``service`` starts loading on ``gpu`` at ``now`` with no task
        (``WarmReplica``); returns when it is ready (after the service's cold start).
        Until then a task of the service may join it (:meth:`started`)."""
        ready = now + self._new_replica_s(gpu, self.services[service])[0]
        self._replicas[gpu] = ReplicaLoad(0, ready)
        self._loaded_at[gpu] = ready
        self._replica_view = None
        return ready

    def loading(self, now: float) -> frozenset[GpuId]:
        """The GPUs whose new replica is still loading at ``now`` (``Snapshot.loading``)."""
        done = [g for g, t in self._loaded_at.items() if t <= now]
        for g in done:
            del self._loaded_at[g]
        return frozenset(self._loaded_at)

    def warmed(self, gpu: GpuId) -> None:
        """The pre-warmed replica on ``gpu`` is ready: if no task joined it, it no
        longer counts as loading (it goes PROTECT); one that serves stays."""
        load = self._replicas.get(gpu)
        if load is not None and load.in_flight == 0:
            del self._replicas[gpu]
            self._replica_view = None

    def ended(self, name: str, now: float) -> GpuId:
        """Task ``name`` ended at ``now``; returns its GPU."""
        task = self.tasks[name]
        assert task.gpu is not None
        task.done = True
        self.finished += 1
        load = self._replicas.get(task.gpu) if self._replicas else None
        if load is not None:
            if load.in_flight > 1:
                self._replicas[task.gpu] = ReplicaLoad(load.in_flight - 1, load.ready_at)
            else:
                del self._replicas[task.gpu]
            self._replica_view = None
        if task.start is not None:
            self.window.ran(task.spec.service, now, now - task.start)
            if self.demand is not None:
                self.demand.ran(task.spec.service, now - task.start)
        return task.gpu

    def service_loads(self, now: float, window_s: float) -> dict[str, ServiceLoad]:
        """Each service's load over ``(now - window_s, now]`` (:class:`LoadWindow`)."""
        return self.window.loads(now, window_s)
