"""The node-local model caches (:mod:`deepboot.runtime.actors.modelcache`), as the
controller sees them: started (or found, after a controller's restart) on every
inference node with ``--host-cache-gb``, an evicted replica's model exported into its
node's cache, and what each holds mirrored for the control loop's snapshot
(``Snapshot.cached``: ATS-I prefers a node that caches the model).

The mirror is advisory: a replica asks its node's cache itself when it loads, so a
stale mirror costs a placement preference, never a wrong start.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.gpu import GpuId
from deepboot.runtime.actors.handles import Actors
from deepboot.runtime.controller.controller_settings import ControllerSettings
from deepboot.runtime.controller.service_catalog import ServiceCatalog
from deepboot.runtime.store.jobstore import JobStore

log = logging.getLogger("deepboot.controller")

CACHE_CALL_TIMEOUT_S = 10.0
"""Longest wait for a model cache to start or to say what it holds (then the
controller goes on without it: starts are cold there until it answers)."""


class HostCaches:
    """The inference nodes' model caches, mirrored (see the module docstring).

    Args:
        actors: The caches' (and the replicas') processes.
        settings: The controller's settings (the cache's size, the export timeout).
        cluster: The cluster (its inference nodes).
        catalog: The services (an evicted replica's model).

    Attributes:
        views: The caches as last heard from them: node -> their view
            (``ModelCache.view``); the snapshot's ``cached`` is read from it.
    """

    def __init__(
        self,
        actors: Actors,
        settings: ControllerSettings,
        cluster: ClusterSpec,
        catalog: ServiceCatalog,
    ) -> None:
        self.actors, self.settings, self.cluster, self.catalog = actors, settings, cluster, catalog
        self.views: dict[int, dict[str, Any]] = {}
        self._models: Mapping[int, frozenset[str]] | None = None  # the snapshot's
        self._changed = False

    def _cache_gb(self) -> float:
        return float(self.settings.shared.host_cache_gb)

    def start(self) -> None:
        """Start (or find, with what they hold) the model cache of every inference
        node, bounded to ``--host-cache-gb``; nothing when the cache is off. Each wait
        is bounded: a cache that does not answer is retried at its node's next
        eviction."""
        if not self._cache_gb():
            return
        for node in self.cluster.pool_nodes(Pool.INFERENCE):
            view = self.actors.ensure_cache(node.node_id, self._cache_gb(), CACHE_CALL_TIMEOUT_S)
            self.set_cache(node.node_id, view)

    def node_left(self, node: int) -> None:
        """Node ``node`` left the cluster: its cache died with it."""
        self.set_cache(node, None)

    def node_back(self, node: int) -> None:
        """Node ``node`` returned to the cluster: start its cache again (empty: the
        old one died with the node), if it is an inference node."""
        if self._cache_gb() and node in {
            n.node_id for n in self.cluster.pool_nodes(Pool.INFERENCE)
        }:
            self.set_cache(
                node, self.actors.ensure_cache(node, self._cache_gb(), CACHE_CALL_TIMEOUT_S)
            )

    def set_cache(self, node: int, view: dict[str, Any] | None) -> None:
        if view is None:
            if self.views.pop(node, None) is not None:
                self._models = None
                self._changed = True
            return
        if self.views.get(node) != view:
            self.views[node] = view
            self._models = None
            self._changed = True

    def cached_models(self) -> Mapping[int, frozenset[str]]:
        """The snapshot's ``cached``: node -> the models its cache holds (as last
        heard); the same object until that changes."""
        view = self._models
        if view is None:
            view = self._models = MappingProxyType(
                {n: frozenset(v["models"]) for n, v in sorted(self.views.items()) if v["models"]}
            )
        return view

    def used(self, node: int, service: str) -> None:
        """A replica of ``service`` on ``node`` started from the node's cache: hear
        what the cache holds now (its order of use changed)."""
        if self._cache_gb():
            self.set_cache(node, self.actors.cache_view(node, CACHE_CALL_TIMEOUT_S))

    def export(self, gpu: GpuId, replica: str, service: str | None) -> str:
        """Ask ``replica`` to export its model into its node's cache, waiting at most
        ``export_timeout``; what happened, for the event log: "" (the cache is off),
        "exported", "held" (the cache holds the model already: nothing to copy),
        "none" (its handler has no ``export_weights``), "not-kept" (larger than the
        whole cache), "failed" (an error or the timeout: logged, and the replica is
        evicted anyway)."""
        spec = self.catalog.specs.get(service) if service else None
        if not self._cache_gb() or spec is None:
            return ""
        node = gpu[0]
        if node not in self.views:  # not started yet, or it did not answer: try again
            self.set_cache(
                node, self.actors.ensure_cache(node, self._cache_gb(), CACHE_CALL_TIMEOUT_S)
            )
            if node not in self.views:
                return "failed"
        if spec.model in self.views[node]["models"]:
            return "held"
        timeout = self.settings.export_timeout
        try:
            view = self.actors.export_replica(replica, node, timeout)
        except Exception as exc:  # noqa: BLE001 (evicted anyway: the GPU is needed)
            log.warning("replica %s: export into node %d's cache failed or took over %g s "
                        "(%s: %s); evicted anyway", replica, node, timeout,
                        type(exc).__name__, exc)  # fmt: skip
            # Heard nothing reliable: ask the cache again (start it, if it died with
            # its node) at the node's next eviction.
            self.set_cache(node, None)
            return "failed"
        if view is None:
            return "none"
        self.set_cache(node, view)
        # Not kept: larger than the whole cache (the cache says so in its log).
        return "exported" if spec.model in view["models"] else "not-kept"

    def write(self, store: JobStore, db: sqlite3.Connection) -> None:
        """What the caches hold, in ``db``, when it changed since the last flush."""
        if self._changed:
            views = [self.views[n] for n in sorted(self.views)]
            store.set_meta(db, "host_cache", json.dumps(views))
            self._changed = False
