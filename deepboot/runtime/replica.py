"""An inference replica: one Ray actor on the one inference-pool GPU ATS-I chose.

The controller creates it (detached, named ``r|<service>|<node.index>|<incarnation>``,
holding that GPU's resource ``deepboot_gpu_<n>_<i>``, so Ray starts it only once the
GPU's previous holder, a lent training worker or another service's replica, is gone).
The router calls :meth:`ServiceReplica.load` once (the cold start, timed), then
:meth:`ServiceReplica.infer` for each request; up to ``concurrency`` calls run at once
(a threaded actor).

A service's handler is a factory named like a job's entry, "file.py:function" or
"package.module:function": ``factory(device: str, **args)`` returns the callable that
maps one request's JSON body to its JSON answer.
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

    def load(self) -> float:
        """Build the handler (the cold start); returns the seconds it took. Idempotent."""
        with self._lock:
            if self._handler is not None:
                return 0.0
            started = time.perf_counter()
            try:
                import torch

                torch.set_num_threads(1)  # one core's worth per logical GPU
                device = "cuda" if torch.cuda.is_available() else "cpu"
            except ImportError:  # a service without torch
                device = "cpu"
            factory: Callable[..., Any] = load_entry(self.spec.handler)
            handler = factory(device, **dict(self.spec.args))
            if not callable(handler):
                raise TypeError(
                    f"{self.spec.handler} returned {type(handler).__name__}, not a callable"
                )
            self._handler = handler
            seconds = time.perf_counter() - started
            print(f"[{self.spec.name} {self.gpu}] loaded in {seconds:.3f} s on {device}")
            return seconds

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
