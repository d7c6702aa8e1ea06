"""An inference replica: one Ray actor on the one inference-pool GPU ATS-I chose.

The controller creates it (detached, named ``r|<service>|<node.index>|<incarnation>``,
holding that GPU's resource ``deepboot_gpu_<n>_<i>``, so Ray starts it only once the
GPU's previous holder, a lent training worker or another service's replica, is gone).
The router calls :meth:`ServiceReplica.load` once (the start, timed), then
:meth:`ServiceReplica.infer` for each request; up to ``concurrency`` calls run at once
(a threaded actor).

A service's handler is a factory named like a job's entry, "file.py:function" or
"package.module:function": ``factory(device: str, **args)`` returns the callable that
maps one request's JSON body to its JSON answer.

The node-local model cache (:mod:`deepboot.runtime.modelcache`, ``deepboot up
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
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from deepboot.core.service import ServiceSpec
from deepboot.elastic.worker import load_entry
from deepboot.runtime.modelcache import cache_name
from deepboot.runtime.raycluster import NAMESPACE
from deepboot.runtime.world import parse_gpu

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


def replica_name(service: str, gpu: str, incarnation: int) -> str:
    return f"{REPLICA_PREFIX}{service}|{gpu}|{incarnation}"


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
        spec: The service (``ServiceSpec.to_json()``).
        gpu: The GPU id "node.index" it runs on.
        log_path: File that receives the replica's output.
    """

    def __init__(self, spec: dict[str, Any], gpu: str, log_path: str) -> None:
        self.spec = ServiceSpec.from_json(spec)
        self.gpu = gpu
        out = open(log_path, "a", buffering=1)  # noqa: SIM115 (lives with the actor)
        sys.stdout = sys.stderr = out
        self._handler: Callable[[Any], Any] | None = None
        self._lock = threading.Lock()
        # The router never sends more than ``concurrency`` calls at once (a call past
        # its deadline restarts the replica); this refuses one more, should it.
        self._slots = threading.BoundedSemaphore(self.spec.concurrency)
        print(f"[{self.spec.name} {gpu}] replica pid {os.getpid()}")

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
            started = time.perf_counter()
            try:
                import torch

                torch.set_num_threads(1)  # one core's worth per logical GPU
                device = "cuda" if torch.cuda.is_available() else "cpu"
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
