"""An inference replica: one Ray actor on the one inference-pool GPU ATS-I chose.

The controller creates it (detached, named ``r|<service>|<node.index>|<incarnation>``,
holding that GPU's resource (``deepboot_gpu_<n>_<i>``, or as
:mod:`deepboot.runtime.actors.rayplacement` says on a cluster attached by labels), so Ray
starts it only once the GPU's previous holder, a lent training worker or another
service's replica, is gone).
The router calls :meth:`ServiceReplica.load` once (the start, timed), then
:meth:`ServiceReplica.infer` for each request; up to ``concurrency`` calls run at once
(a threaded actor).

A service's handler is a factory named like a job's entry, "file.py:function" or
"package.module:function": ``factory(device: str, **args)`` returns the callable that
maps one request's JSON body to its JSON answer.

The node-local model cache (:mod:`deepboot.runtime.actors.modelcache`, ``deepboot up
--host-cache-gb``) adds an optional pair, both or neither:

- ``handler.export_weights() -> weights``: the handler's weights as a picklable object,
  ideally a dict of numpy arrays (the object store hands those back zero-copy). The
  controller asks for it (:meth:`ServiceReplica.export`) before it evicts the replica,
  and the node's cache keeps it under the service's ``model``.
- ``factory.from_weights(device: str, exported, **args) -> handler``: builds the
  handler from exported weights (the second positional argument: name it apart from
  the service's ``[args]``) instead of the full load; an attribute of the factory (a
  classmethod when the factory is a class, ``load.from_weights = restore`` for a
  function). The arrays are read-only views on shared memory: copy them (onto the
  device) rather than write to them.

:meth:`ServiceReplica.load` restores from the cache (a *host start*) when the factory
has ``from_weights`` and its node's cache holds the model; otherwise, or if the
restore fails, it loads in full (a *cold start*). Services that share a ``model``
name share its cached weights: give services with different weights different
``model`` names. A handler without the pair behaves as before the cache.

Standby replicas (``deepboot up --standby-replicas``): a replica's process start and
its ``import torch`` take 1.5-3 s on a small machine, longer than a restore from the
node's cache. A *standby* is a replica actor started ahead of need on an inference
node, with no service and no GPU: it has only imported (``ServiceReplica(None, ...)``,
named by :func:`standby_name`). When a replica is needed on that node the controller
promotes it (:meth:`ServiceReplica.become`): it takes the service and the GPU, and
asks Ray for the GPU's resource by a placement group of its own. Created by a
detached actor, the group lives as long as the actor does, so the GPU stays Ray's to
guard as for any replica: the standby loads only once the group is placed (the GPU's
previous holder is gone), and a worker that asks for the GPU next waits until the
promoted standby is dead.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deepboot.core.service import ServiceSpec
from deepboot.elastic.devices import torch_device
from deepboot.elastic.worker import load_entry
from deepboot.runtime.actors.modelcache import cache_name
from deepboot.runtime.actors.rayplacement import Ask, placement_group_for
from deepboot.runtime.cluster.raycluster import NAMESPACE
from deepboot.runtime.controller.jobrecords import parse_gpu

CACHE_ASK_TIMEOUT_S = 5.0
"""Longest wait for the node's cache to answer whether it holds the model (then the
replica loads in full)."""

CACHE_READ_TIMEOUT_S = 60.0
"""Longest wait for a cached model's object (a local read; longer only when Ray
spilled it to disk), then the replica loads in full."""

EXPORT_HANDLER = "export_weights"
"""The handler's optional method that exports its weights (see the module doc)."""

RESTORE_FACTORY = "from_weights"
"""The factory's optional attribute that builds a handler from them."""

REPLICA_PREFIX = "r|"
"""Start of every replica actor's name (see :func:`replica_name`)."""


STANDBY_SERVICE = "~standby"
"""The service part of a standby's name (``~`` is in no service's name)."""

STANDBY_CONCURRENCY = 64
"""Calls a standby takes at once (its actor's ``max_concurrency``, fixed before it
knows its service): a service with more than one less than this is never given one."""

PLACEMENT_WAIT_S = 600.0
"""Longest wait of a promoted standby for its GPU (the router's load timeout, shorter
for most services, ends it sooner)."""


def replica_name(service: str, gpu: str, incarnation: int) -> str:
    return f"{REPLICA_PREFIX}{service}|{gpu}|{incarnation}"


def standby_name(node: int, incarnation: int) -> str:
    """The name of standby ``incarnation`` of node ``node``: ``r|~standby|<node>|<inc>``
    (a replica's prefix, so that ``deepboot down`` and recovery find it)."""
    return f"{REPLICA_PREFIX}{STANDBY_SERVICE}|{node}|{incarnation}"


def is_standby_name(name: str) -> bool:
    return name.startswith(f"{REPLICA_PREFIX}{STANDBY_SERVICE}|")


def parse_replica_name(name: str) -> tuple[str, str, int] | None:
    """(service, gpu id, incarnation) of a replica actor's name; None for another name."""
    if not name.startswith(REPLICA_PREFIX):
        return None
    try:
        service, gpu, inc = name[len(REPLICA_PREFIX) :].rsplit("|", 2)
        return service, gpu, int(inc)
    except ValueError:
        return None


class ServiceReplica:
    """One replica of one service on one GPU (wrapped by ``ray.remote`` by the controller).

    Args:
        spec: The service (``ServiceSpec.to_json()``); None for a standby (module doc),
            which only imports until :meth:`become` gives it a service.
        gpu: The GPU id "node.index" it runs on (a standby: its node, for its log).
        log_path: File that receives the replica's output.
    """

    def __init__(self, spec: dict[str, Any] | None, gpu: str, log_path: str) -> None:
        self._handler: Callable[[Any], Any] | None = None
        self._lock = threading.Lock()
        self._placement: Any = None  # a promoted standby's placement group (its GPU)
        if spec is None:
            self._log_to(log_path)
            started = time.perf_counter()
            _preimport()
            print(f"[standby {gpu}] pid {os.getpid()}, imported in "
                  f"{time.perf_counter() - started:.3f} s")  # fmt: skip
            return
        self._serve(spec, gpu, log_path)

    def _serve(self, spec: dict[str, Any], gpu: str, log_path: str) -> None:
        self.spec = ServiceSpec.from_json(spec)
        self.gpu = gpu
        self._log_to(log_path)
        # The router never sends more than ``concurrency`` calls at once (a call past
        # its deadline restarts the replica); this refuses one more, should it.
        self._slots = threading.BoundedSemaphore(self.spec.concurrency)
        print(f"[{self.spec.name} {gpu}] replica pid {os.getpid()}")

    @staticmethod
    def _log_to(log_path: str) -> None:
        # Bounded as the controller's log (issue 42, finding 3): a handler that prints
        # on every request cannot fill the disk; the replicas of a service share the
        # file and rotate it under one lock.
        from deepboot.runtime.logbounds import SharedLog

        sys.stdout = sys.stderr = SharedLog(Path(log_path))  # lives with the actor

    def become(self, spec: dict[str, Any], gpu: str, log_path: str, ask: Ask) -> int:
        """Promote this standby to a replica of ``spec`` on ``gpu``, asked of Ray as
        ``ask`` (:meth:`~deepboot.runtime.actors.rayplacement.Placement.gpu`): by a
        placement group of this actor's (placed once the GPU's previous holder is
        gone; removed by Ray when this actor dies), and return at once; :meth:`load`
        waits for the group. Returns the process id.

        Raises:
            RuntimeError: it is a replica already (promoted, or started as one).
        """
        with self._lock:
            if hasattr(self, "spec"):
                raise RuntimeError(f"already a replica of {self.spec.name} on {self.gpu}")
            self._placement = placement_group_for(ask)
            self._serve(spec, gpu, log_path)
        return os.getpid()

    def _wait_for_gpu(self) -> None:
        """A promoted standby: block until its GPU is its own (the placement group is
        placed), at most :data:`PLACEMENT_WAIT_S`."""
        if self._placement is None:
            return
        import ray

        started = time.perf_counter()
        ray.get(self._placement.ready(), timeout=PLACEMENT_WAIT_S)
        print(f"[{self.spec.name} {self.gpu}] promoted standby: had the GPU after "
              f"{time.perf_counter() - started:.3f} s")  # fmt: skip

    def load(self) -> dict[str, Any]:
        """Build the handler: from the node's cache when it holds the model and the
        factory can restore (a host start), else in full (a cold start). Idempotent.

        Returns:
            ``seconds`` it took and ``start``: "host", "cold", or "" when it had
            loaded already.
        """
        with self._lock:
            if self._handler is not None:
                return {"seconds": 0.0, "start": ""}
            self._wait_for_gpu()  # before the clock: a queued replica's wait is Ray's
            started = time.perf_counter()
            try:
                import torch

                torch.set_num_threads(1)  # one core's worth per logical GPU
                # This replica's GPU as a CUDA device ("cuda:<index>"), or the CPU.
                device = str(torch_device(self.gpu))
            except ImportError:  # a service without torch
                device = "cpu"
            factory: Callable[..., Any] = load_entry(self.spec.handler)
            args = dict(self.spec.args)
            imported = time.perf_counter() - started  # the same for either start
            handler = self._restore(factory, device, args)
            start = "host" if handler is not None else "cold"
            if handler is None:
                handler = factory(device, **args)
            if not callable(handler):
                raise TypeError(
                    f"{self.spec.handler} returned {type(handler).__name__}, not a callable"
                )
            self._handler = handler
            seconds = time.perf_counter() - started
            print(f"[{self.spec.name} {self.gpu}] loaded ({start} start) in {seconds:.3f} s "
                  f"on {device} ({imported:.3f} s of it importing)")  # fmt: skip
            return {"seconds": seconds, "start": start}

    def _restore(
        self, factory: Callable[..., Any], device: str, args: dict[str, Any]
    ) -> Callable[[Any], Any] | None:
        """The handler built from the node's cached copy of the model; None when the
        factory cannot restore, the node has no cache or it does not hold the model,
        or the restore failed (logged: the caller loads in full)."""
        restore = getattr(factory, RESTORE_FACTORY, None)
        if restore is None:
            return None
        try:
            import ray

            cache = ray.get_actor(cache_name(parse_gpu(self.gpu)[0]), namespace=NAMESPACE)
        except (ImportError, ValueError):  # no cache on this node (off, or not yet)
            return None
        try:
            box: Any = ray.get(cache.take.remote(self.spec.model), timeout=CACHE_ASK_TIMEOUT_S)
            if box is None:
                return None
            asked = time.perf_counter()
            weights = ray.get(box[0], timeout=CACHE_READ_TIMEOUT_S)
            read = time.perf_counter()
            handler: Callable[[Any], Any] = restore(device, weights, **args)
            print(f"[{self.spec.name} {self.gpu}] read the cached model in {read - asked:.3f} s, "
                  f"restored it in {time.perf_counter() - read:.3f} s")  # fmt: skip
            return handler
        except Exception as exc:  # noqa: BLE001 (a cold start is always possible)
            print(f"[{self.spec.name} {self.gpu}] restore from the cache failed "
                  f"({type(exc).__name__}: {exc}); loading in full")  # fmt: skip
            return None

    def export(self, cache: str, timeout: float) -> dict[str, Any] | None:
        """Export the handler's weights into the cache actor ``cache`` (this node's),
        under the service's model; returns the cache's view after it, or None when
        there is nothing to export (not loaded, or the handler has no
        ``export_weights``).

        Raises:
            ValueError: no such cache actor.
            ray.exceptions.GetTimeoutError: the cache did not take it in ``timeout`` s.
        """
        with self._lock:
            handler = self._handler
        export = getattr(handler, EXPORT_HANDLER, None) if handler is not None else None
        if export is None:
            return None
        import ray

        weights = export()
        actor = ray.get_actor(cache, namespace=NAMESPACE)
        view: Any = ray.get(actor.keep.remote(self.spec.model, weights), timeout=timeout)
        return dict(view)

    def infer(self, payload: Any) -> Any:
        """The handler's answer to one request's body.

        Raises:
            RuntimeError: ``concurrency`` calls are running already.
        """
        if not self._slots.acquire(blocking=False):
            raise RuntimeError(f"more than {self.spec.concurrency} calls at once")
        try:
            handler = self._handler
            if handler is None:
                self.load()
                handler = self._handler
            assert handler is not None
            return handler(payload)
        finally:
            self._slots.release()

    def pid(self) -> int:
        return os.getpid()


def _preimport() -> None:
    """A standby's imports: torch (when installed), as a replica's load would."""
    try:
        import torch

        torch.set_num_threads(1)  # one core's worth per logical GPU
    except ImportError:  # a cluster whose services have no torch
        pass
