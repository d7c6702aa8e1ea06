"""The Ray side of the runtime: create, reach, find and kill elastic workers and
inference replicas (:mod:`deepboot.runtime.actors.replica_actor`).

The controller sees only the :class:`Actors` protocol; :class:`RayActors` is the
implementation on a Ray cluster, and the fast tests drive the controller's
generations, polls and recovery in-process with a fake one
(``tests/runtime/fake_actors.py``).

Each worker is a detached, named actor (it outlives the controller) in the
``deepboot`` namespace, holding exactly one GPU's resource (``deepboot_gpu_<n>_<i>``;
on a cluster attached by labels ``deepboot_gpu_<i>`` on the node's Ray node id: how,
:mod:`deepboot.runtime.actors.rayplacement` alone decides), so the worker runs on the
GPU the scheduler chose. Names:
``w|<job>|<node.index>|<incarnation>``; the incarnation grows with every actor the
job starts, so a new worker never collides with a dying one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from deepboot.elastic.protocol import Generation, WorkerConfig, WorkerReport
from deepboot.runtime.actors.rayplacement import RayAsks
from deepboot.runtime.cluster.raycluster import NAMESPACE
from deepboot.runtime.controller.jobrecords import parse_gpu

log = logging.getLogger(__name__)

STOP_MARGIN_S = 5.0
"""What a command replica's kill waits beyond its stop grace for the stop to end."""

WORKER_PREFIX = "w|"
"""Start of every worker actor's name (see :func:`actor_name`)."""


def actor_name(job: str, gpu: str, incarnation: int) -> str:
    return f"{WORKER_PREFIX}{job}|{gpu}|{incarnation}"


@dataclass(frozen=True, slots=True)
class ActorName:
    job: str
    gpu: str
    incarnation: int

    @classmethod
    def parse(cls, name: str) -> ActorName | None:
        if not name.startswith(WORKER_PREFIX):
            return None
        try:
            job, gpu, inc = name[len(WORKER_PREFIX) :].rsplit("|", 2)
            return cls(job, gpu, int(inc))
        except ValueError:
            return None


def _on_gpu(asks: RayAsks, name: str, gpu: str, concurrency: int) -> dict[str, Any]:
    """Ray options of a detached, named actor holding exactly ``gpu`` (Ray starts it
    once the GPU's previous holder is gone), never restarted by Ray."""
    return {
        "name": name,
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "num_cpus": 0,
        **asks.gpu(*parse_gpu(gpu)).actor_options(),
        "max_restarts": 0,
        "max_concurrency": concurrency,
    }


def _on_node(asks: RayAsks, name: str, node: int, concurrency: int) -> dict[str, Any]:
    """Ray options of a detached, named actor on deepboot node ``node``, holding no GPU
    (a standby, a command replica that holds its GPUs by a placement group of its own),
    never restarted by Ray."""
    return {
        "name": name,
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "num_cpus": 0,
        **asks.node(node).actor_options(),
        "max_restarts": 0,
        "max_concurrency": concurrency,
    }


class Actors(Protocol):
    """What the controller asks of the processes it runs: elastic workers (one per
    GPU of a job) and inference replicas, each a named actor that outlives the
    controller."""

    def create(self, name: str, config: WorkerConfig, gpu: str, first: Generation) -> None:
        """Start worker ``name`` on ``gpu``, offered generation ``first``."""
        ...

    def create_replica(
        self,
        name: str,
        spec: dict[str, Any],
        gpu: str,
        log_path: str,
        more_gpus: tuple[str, ...] = (),
    ) -> Any:
        """Start replica ``name`` of a service on ``gpu`` (and ``more_gpus`` of the
        same node: a command service's replica of several GPUs); returns its handle."""
        ...

    def create_standby(self, name: str, node: int, log_path: str) -> None:
        """Start standby ``name`` on node ``node`` (no GPU, no service: it imports;
        :mod:`deepboot.runtime.actors.replica_actor`); never waits for it."""
        ...

    def standby_ready(self, name: str) -> bool:
        """Whether standby ``name`` has finished its imports, or died (its promotion
        then fails at once); never waits."""
        ...

    def promote(
        self, name: str, spec: dict[str, Any], gpu: str, log_path: str, timeout: float
    ) -> Any:
        """Make standby ``name`` a replica of a service on ``gpu``; returns its handle.

        Raises:
            Exception: it did not take it within ``timeout`` seconds, or is dead (the
                caller kills it and starts a new replica).
        """
        ...

    def handle(self, name: str) -> Any:
        """The handle of a named actor (the router calls a replica through it)."""
        ...

    def sleep_replica(self, name: str, timeout: float) -> dict[str, Any]:
        """Ask command replica ``name`` to put its server to sleep and give its GPUs
        back (:meth:`~deepboot.runtime.actors.command_replica.CommandReplica.sleep`),
        waiting at most ``timeout`` seconds; its answer (``ok``, ``seconds``,
        ``error``). A replica that did not answer in time, or died: ``ok`` False."""
        ...

    def offer(self, name: str, gen: Generation) -> None:
        """Offer worker ``name`` a generation (a gone actor: nothing; the poll sees it)."""
        ...

    def reports(self, names: list[str]) -> dict[str, WorkerReport | None]:
        """Each worker's latest report, None for a dead one; one not answering yet is
        left out (never waited for long)."""
        ...

    def kill(self, name: str) -> None:
        """Kill actor ``name`` (gone already: nothing)."""
        ...

    def list_workers(self) -> list[str]:
        """Every live worker's name."""
        ...

    def list_named(self, prefix: str) -> list[str]:
        """Every live actor's name that starts with ``prefix``, sorted."""
        ...

    def live_nodes(self) -> frozenset[int] | None:
        """The deepboot ids of the nodes the cluster lists alive; None when it
        cannot tell now."""
        ...

    def ensure_cache(self, node: int, capacity_gb: float, timeout: float) -> dict[str, Any] | None:
        """Start node ``node``'s model cache (or find the one running, with what it
        holds) bounded to ``capacity_gb``; its view
        (:meth:`~deepboot.runtime.actors.modelcache.ModelCache.view`), or None when it did
        not answer within ``timeout`` seconds."""
        ...

    def cache_view(self, node: int, timeout: float) -> dict[str, Any] | None:
        """What node ``node``'s cache holds; None when it did not answer in time."""
        ...

    def export_replica(self, name: str, node: int, timeout: float) -> dict[str, Any] | None:
        """Ask replica ``name`` to export its weights into node ``node``'s cache,
        waiting at most ``timeout`` seconds; the cache's view after it, or None when
        the replica has nothing to export.

        Raises:
            Exception: it failed or timed out (the caller evicts anyway).
        """
        ...


class RayActors:
    """Worker actors on a connected Ray cluster (``ray.init`` done by the caller),
    placed as ``asks`` says (``RayAsks.of`` the cluster's record)."""

    def __init__(self, asks: RayAsks, report_timeout: float = 0.5) -> None:
        import ray

        from deepboot.elastic.worker import ElasticWorker

        self._asks = asks
        self._ray = ray
        self._cls = ray.remote(ElasticWorker)
        self._command_cls: Any = None
        self._replica_cls: Any = None
        self._cache_cls: Any = None
        self._command_replica_cls: Any = None
        # Command replicas started here, and their stop grace: a kill stops their
        # server first (SIGTERM, grace, SIGKILL), without waiting for it.
        self._graceful: dict[str, float] = {}
        self._handles: dict[str, Any] = {}
        self._standby_pids: dict[str, Any] = {}  # standby name -> its pid call
        self._asked: dict[str, Any] = {}  # actor name -> its unanswered report request
        self._report_timeout = report_timeout

    def create(self, name: str, config: WorkerConfig, gpu: str, first: Generation) -> None:
        """Start worker ``name`` of ``config.job`` on ``gpu`` (Ray queues it until the
        GPU's resource is free, that is until the GPU's previous worker is killed): an
        elastic worker, or a command job's (:mod:`deepboot.elastic.command`)."""
        cls = self._cls
        if config.command:
            if self._command_cls is None:
                from deepboot.elastic.command import CommandWorker

                self._command_cls = self._ray.remote(CommandWorker)
            cls = self._command_cls
        options = _on_gpu(self._asks, name, gpu, concurrency=4)
        handle = cls.options(**options).remote(config, gpu, first)
        self._handles[name] = handle

    def create_replica(
        self,
        name: str,
        spec: dict[str, Any],
        gpu: str,
        log_path: str,
        more_gpus: tuple[str, ...] = (),
    ) -> Any:
        """Start replica ``name`` of a service on ``gpu`` (queued by Ray until the GPU's
        resource is free); returns its handle. It takes ``concurrency`` requests at
        once, plus one call of the router's (load). A command service's replica holds
        ``gpu`` and ``more_gpus`` by a placement group of its own."""
        from deepboot.runtime.actors.replica_actor import ServiceReplica

        if spec.get("command"):
            return self._create_command_replica(name, spec, [gpu, *more_gpus], log_path)
        if more_gpus:
            raise ValueError(f"replica {name}: a handler service's replica has one GPU")
        if self._replica_cls is None:
            self._replica_cls = self._ray.remote(ServiceReplica)
        concurrency = int(spec.get("concurrency", 1)) + 1
        options = _on_gpu(self._asks, name, gpu, concurrency=concurrency)
        handle = self._replica_cls.options(**options).remote(spec, gpu, log_path)
        self._handles[name] = handle
        return handle

    def _create_command_replica(
        self, name: str, spec: dict[str, Any], gpus: list[str], log_path: str
    ) -> Any:
        """A command service's replica (:mod:`deepboot.runtime.actors.command_replica`):
        on its node; it holds its GPUs by a placement group of its own (their ask, one
        bundle), so that it can give them back asleep."""
        from deepboot.runtime.actors.command_replica import COMMAND_CONCURRENCY, CommandReplica

        if self._command_replica_cls is None:
            self._command_replica_cls = self._ray.remote(CommandReplica)
        node = parse_gpu(gpus[0])[0]
        ask = self._asks.gpus([parse_gpu(g) for g in gpus])
        options = _on_node(self._asks, name, node, COMMAND_CONCURRENCY)
        handle = self._command_replica_cls.options(**options).remote(spec, gpus, log_path, ask)
        self._handles[name] = handle
        self._graceful[name] = float(spec.get("stop_grace_s", 10.0))
        return handle

    def sleep_replica(self, name: str, timeout: float) -> dict[str, Any]:
        try:
            answer: Any = self._ray.get(self._handle(name).sleep.remote(), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 (timed out or died: the caller evicts)
            return {"ok": False, "seconds": timeout, "error": f"{type(exc).__name__}: {exc}"}
        return dict(answer)

    def create_standby(self, name: str, node: int, log_path: str) -> None:
        """Start standby ``name`` on node ``node``: detached, named, on the node (no
        GPU), never restarted by Ray; the pid call asked now
        answers once its imports are done (:meth:`standby_ready`)."""
        from deepboot.runtime.actors.replica_actor import STANDBY_CONCURRENCY, ServiceReplica

        if self._replica_cls is None:
            self._replica_cls = self._ray.remote(ServiceReplica)
        options = _on_node(self._asks, name, node, STANDBY_CONCURRENCY)
        handle = self._replica_cls.options(**options).remote(None, f"node {node}", log_path)
        self._handles[name] = handle
        self._standby_pids[name] = handle.pid.remote()

    def standby_ready(self, name: str) -> bool:
        ref = self._standby_pids.get(name)
        if ref is None:
            return False
        done, _ = self._ray.wait([ref], timeout=0)
        return bool(done)

    def promote(
        self, name: str, spec: dict[str, Any], gpu: str, log_path: str, timeout: float
    ) -> Any:
        """The standby takes the service and asks for ``gpu`` (it does not wait for it:
        its load does); a wait of at most ``timeout`` for its answer."""
        self._standby_pids.pop(name, None)
        handle = self._handle(name)
        ref = handle.become.remote(spec, gpu, log_path, self._asks.gpu(*parse_gpu(gpu)))
        self._ray.get(ref, timeout=timeout)
        return handle

    def handle(self, name: str) -> Any:
        """The handle of a named actor (worker or replica)."""
        return self._handle(name)

    def _handle(self, name: str) -> Any:
        h = self._handles.get(name)
        if h is None:
            h = self._handles[name] = self._ray.get_actor(name, namespace=NAMESPACE)
        return h

    def offer(self, name: str, gen: Generation) -> None:
        try:
            self._handle(name).offer.remote(gen)
        except ValueError:  # no such actor (it died): the poll will see it
            log.warning("offer to %s: the actor is gone", name)

    def reports(self, names: list[str]) -> dict[str, WorkerReport | None]:
        """Each actor's report; None for an actor that is dead or gone.

        An actor that has not answered yet (not yet scheduled: its GPU is still held;
        or busy starting) is left out, and its pending report request is reused by
        the next call, so a slow actor never holds up the controller's loop for more
        than the short wait below.
        """
        ray = self._ray
        out: dict[str, WorkerReport | None] = {}
        asked: dict[Any, str] = {}
        for name in names:
            ref = self._asked.get(name)
            if ref is None:
                try:
                    ref = self._asked[name] = self._handle(name).report.remote()
                except ValueError:
                    out[name] = None
                    continue
            asked[ref] = name
        if not asked:
            return out
        ready, _ = ray.wait(list(asked), num_returns=len(asked), timeout=self._report_timeout)
        for ref in ready:
            name = asked[ref]
            del self._asked[name]
            try:
                out[name] = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError):
                out[name] = None
            except ray.exceptions.RayError as exc:
                log.warning("report of %s failed: %s", name, exc)
        return out

    def kill(self, name: str) -> None:
        """Kill actor ``name``; a command replica's server is stopped first (its
        ``stop``, then the kill after its grace and a margin, in a thread: never
        waited for here)."""
        grace = self._graceful.pop(name, None)
        if grace is not None:
            with contextlib.suppress(Exception):  # gone already: nothing to stop
                handle = self._handle(name)
                done = handle.stop.remote()
                threading.Thread(
                    target=self._kill_after, args=(name, handle, done, grace + STOP_MARGIN_S),
                    daemon=True,
                ).start()  # fmt: skip
                self._handles.pop(name, None)
                return
        with contextlib.suppress(ValueError):  # already gone
            self._ray.kill(self._handle(name), no_restart=True)
        self._handles.pop(name, None)
        self._asked.pop(name, None)
        self._standby_pids.pop(name, None)

    def _kill_after(self, name: str, handle: Any, done: Any, wait_s: float) -> None:
        """A command replica's end: its server stopped (at most ``wait_s``), then the
        actor killed."""
        with contextlib.suppress(Exception):
            self._ray.wait([done], timeout=wait_s)
        with contextlib.suppress(Exception):
            self._ray.kill(handle, no_restart=True)
        log.debug("command replica %s ended", name)

    def list_workers(self) -> list[str]:
        """Names of every live worker actor in the namespace."""
        return self.list_named(WORKER_PREFIX)

    def list_named(self, prefix: str) -> list[str]:
        """Names of every live actor of the namespace that start with ``prefix``."""
        from ray.util import list_named_actors

        names = [
            a["name"]
            for a in list_named_actors(all_namespaces=True)
            if a.get("namespace") == NAMESPACE and a["name"].startswith(prefix)
        ]
        return sorted(names)

    def live_nodes(self) -> frozenset[int] | None:
        """The deepboot nodes Ray lists alive (the GCS's view: a node is dead once it
        missed its health checks); None when the GCS does not answer."""
        try:
            return self._asks.live_nodes(self._ray.nodes())  # type: ignore[no-untyped-call]
        except Exception as exc:  # noqa: BLE001 (the GCS unreachable now: ask again later)
            log.warning("could not list the Ray nodes: %s", exc)
            return None

    def ensure_cache(self, node: int, capacity_gb: float, timeout: float) -> dict[str, Any] | None:
        """Create node ``node``'s cache actor unless it runs (detached, named
        ``c|<node>``, on that node, never restarted by Ray: a cache
        that died comes back empty at the next call), set its bound, and return its
        view; None when it did not answer within ``timeout`` (its node is gone, say)."""
        from deepboot.runtime.actors.modelcache import ModelCache, cache_name

        ray = self._ray
        if self._cache_cls is None:
            self._cache_cls = ray.remote(ModelCache)
        try:
            handle = self._cache_cls.options(
                name=cache_name(node),
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                **self._asks.node(node).actor_options(),
                max_restarts=0,
            ).remote(node, capacity_gb)
            view: Any = ray.get(handle.configure.remote(capacity_gb), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 (no cache now: cold starts, never an error)
            log.warning("the model cache of node %d did not answer: %s", node, exc)
            return None
        return dict(view)

    def cache_view(self, node: int, timeout: float) -> dict[str, Any] | None:
        from deepboot.runtime.actors.modelcache import cache_name

        try:
            handle = self._ray.get_actor(cache_name(node), namespace=NAMESPACE)
            view: Any = self._ray.get(handle.view.remote(), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 (gone or slow: the caller keeps its last view)
            log.warning("the model cache of node %d did not answer: %s", node, exc)
            return None
        return dict(view)

    def export_replica(self, name: str, node: int, timeout: float) -> dict[str, Any] | None:
        """The replica exports, and puts into the cache, within ``timeout`` (the
        replica's own wait on the cache is bounded by it too)."""
        from deepboot.runtime.actors.modelcache import cache_name

        # A call still running at the timeout ends with the replica (killed next).
        ref = self._handle(name).export.remote(cache_name(node), timeout)
        view: Any = self._ray.get(ref, timeout=timeout)
        return None if view is None else dict(view)
