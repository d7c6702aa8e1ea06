"""The runtime's node-local model cache: an evicted replica's weights stay in its node's
host memory, and the next replica of that model on that node restores from them (a
*host start*) instead of loading in full (a *cold start*). The simulator's model of it
is :mod:`deepboot.world.hostcache`; this module is its runtime side (issue 23).

Mechanism, and why: one detached Ray actor per inference node, named ``c|<node>``,
pinned to its node (the node's resource ``deepboot_node_<n>``, or its Ray node id on a
cluster attached by labels: :mod:`deepboot.runtime.actors.rayplacement`), holding each
model's exported weights as an object in Ray's object store that it ``ray.put`` itself.

- The object store is shared memory on the node: a replica on the same node reads a
  cached model back with ``ray.get`` and gets its numpy arrays *zero-copy* (read-only
  views on the shared pages); the only copy a host start pays is the handler's own,
  into its device. A cache of our own (a shared-memory segment per model, a file in
  ``/dev/shm``) would re-implement Ray's reference counting, spilling and cleanup.
- The cache actor, not the replica, owns the objects (``ray.put`` from the cache's
  process): an object lives as long as its owner, so the weights outlive the replica
  that exported them (killed right after its export) and go when the cache drops
  them or when ``deepboot down`` stops the cache actor.
- Detached and named by node, it outlives the controller: a restarted controller finds
  it by name (``get_if_exists``) with everything it held; no store row is needed,
  because the cache holds only copies that a full load can always rebuild: losing it
  (its node died, ``down``) costs cold starts, never correctness.

The bound is in bytes: ``host_cache_gb`` x 10^9 per node. :class:`ModelCache` keeps the
simulator's ledger (:class:`~deepboot.world.hostcache.HostCache`, least recently used
out first, a model larger than the whole cache not kept) counting bytes, and drops
the object of every model the ledger lets go, so the bytes it holds never exceed the
bound. An insert briefly holds the exported object twice (the export's argument,
which the replica owns, and the cache's copy) until the export's call returns.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Mapping
from typing import Any

from deepboot.world.hostcache import HostCache, HostCacheConfig

log = logging.getLogger(__name__)

CACHE_PREFIX = "c|"
"""Start of every cache actor's name (see :func:`cache_name`)."""

BYTES_PER_GB = 10**9
"""The bound's unit: ``--host-cache-gb`` counts decimal GB, as ``model_gb`` does."""


def cache_name(node: int) -> str:
    """The name of deepboot node ``node``'s cache actor."""
    return f"{CACHE_PREFIX}{node}"


def bound_bytes(capacity_gb: float) -> int:
    """The byte bound of a cache of ``capacity_gb`` GB."""
    return int(capacity_gb * BYTES_PER_GB)


def weights_nbytes(weights: Any) -> int:
    """The bytes ``weights`` take in the cache: a numpy array's buffer, a bytes-like
    object's length, the sum over a dict's values or a list's or tuple's items, and
    the pickled size of anything else (what the object store holds of it)."""
    nbytes = getattr(weights, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(weights, bytes | bytearray | memoryview):
        return len(weights)
    if isinstance(weights, Mapping):
        return sum(weights_nbytes(v) for v in weights.values())
    if isinstance(weights, list | tuple):
        return sum(weights_nbytes(v) for v in weights)
    return len(pickle.dumps(weights, protocol=pickle.HIGHEST_PROTOCOL))


class ModelCache:
    """One node's cached models (wrapped by ``ray.remote`` as the actor ``c|<node>``).

    Args:
        node: The deepboot node it serves.
        capacity_gb: Its bound, GB (``--host-cache-gb``); 0 keeps nothing.
        put: Stores a value and returns its handle (default ``ray.put``, from this
            actor's process so that the actor owns the object); the fast tests
            pass the identity.
    """

    def __init__(
        self, node: int, capacity_gb: float, put: Callable[[Any], Any] | None = None
    ) -> None:
        self.node = node
        self._put = put if put is not None else _ray_put
        self._refs: dict[str, Any] = {}  # model -> its object (ray.ObjectRef)
        self._bytes: dict[str, int] = {}  # model -> its size, bytes
        self._ledger = self._new_ledger(capacity_gb)
        self.capacity_gb = capacity_gb

    def _new_ledger(self, capacity_gb: float) -> HostCache:
        # The simulator's ledger, in bytes here: integer byte counts add up exactly
        # as floats (below 2^53), so its "fits" test is exact.
        return HostCache(HostCacheConfig(capacity_gb=float(bound_bytes(capacity_gb))), [self.node])

    def configure(self, capacity_gb: float) -> dict[str, Any]:
        """Set the bound (a controller's ``--host-cache-gb``, at each of its starts):
        the models kept, most recently used first, while they fit. Returns
        :meth:`view`."""
        order = self._ledger.contents(self.node)
        self._ledger = self._new_ledger(capacity_gb)
        self.capacity_gb = capacity_gb
        for model in order:  # least recently used first: the last kept is the newest
            self._ledger.keep(self.node, model, float(self._bytes[model]))
        self._sync()
        return self.view()

    def keep(self, model: str, weights: Any) -> dict[str, Any]:
        """Keep ``weights`` as ``model``'s (an evicted replica's export): the most
        recently used; the least recently used go until it fits. One larger than the
        whole bound is not kept (a copy held before stays). Returns :meth:`view`."""
        size = weights_nbytes(weights)
        if size > bound_bytes(self.capacity_gb):
            log.info("cache %s: %s (%d bytes) exceeds the bound; not kept", self.node, model, size)
            return self.view()
        ref = self._put(weights)
        self._ledger.keep(self.node, model, float(size))
        self._refs[model], self._bytes[model] = ref, size
        self._sync()
        return self.view()

    def take(self, model: str) -> list[Any] | None:
        """``model``'s object for a replica that restores from it (then the most
        recently used), in a list so that Ray hands the caller the reference, not
        the value; None when not cached."""
        if not self._ledger.holds(self.node, model):
            return None
        self._ledger.use(self.node, model)
        return [self._refs[model]]

    def view(self) -> dict[str, Any]:
        """What the cache holds: ``node``, ``models`` (least recently used first),
        ``used_bytes``, ``bound_bytes``."""
        models = list(self._ledger.contents(self.node))
        return {
            "node": self.node,
            "models": models,
            "used_bytes": sum(self._bytes[m] for m in models),
            "bound_bytes": bound_bytes(self.capacity_gb),
        }

    def _sync(self) -> None:
        """Drop the objects of the models the ledger let go (their memory goes back
        to the object store once no replica still reads them)."""
        kept = set(self._ledger.contents(self.node))
        for model in [m for m in self._refs if m not in kept]:
            del self._refs[model], self._bytes[model]


def _ray_put(value: Any) -> Any:
    import ray

    return ray.put(value)
