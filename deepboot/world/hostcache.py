"""Models kept in a node's host memory, so that a replica starts from there instead of
cold (issue 23's "warm from host memory").

When a replica is evicted from its GPU (the GPU is lent to training, or taken by
another service's replica), its weights stay in the node's host memory: the next
replica of that model on that node copies them to its GPU (a *host start*,
:meth:`HostCacheConfig.start_s`) instead of loading them from remote storage (the
service's cold start). Each node has its own bounded cache, least recently used
models first out; a model larger than the whole cache is not kept.

:class:`HostCache` is a world's ledger of what each node holds (the simulator's now;
the runtime's node-local cache will keep the same ledger). It is off (capacity 0, the
default) unless a run turns it on: then nothing changes anywhere.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from deepboot.core.errors import ConfigError

DEFAULT_HOST_GBPS = 12.0
"""Host-to-GPU copy bandwidth, GB/s. An assumption, stated: PCIe 4.0 x16 carries
32 GB/s raw, about 25 GB/s for a copy from pinned host memory; a copy from ordinary
(pageable) memory, as a framework's plain load does, gets roughly half of that."""

DEFAULT_HOST_INIT_S = 0.5
"""Fixed part of a host start, seconds: the replica's process, CUDA context and
allocator before its weights arrive. An assumption, stated: set it to a measured one
(``--host-init-s``)."""

MODEL_GB: Mapping[str, float] = MappingProxyType(
    {
        # fp32 weights: parameters x 4 bytes, parameter counts from each model's paper.
        "bert": 0.44,  # BERT-base, 110 M parameters (Devlin et al., NAACL 2019)
        "cifar10": 0.047,  # ResNet-18, 11.7 M (He et al., CVPR 2016; torchvision)
        "imagenet": 0.10,  # ResNet-50, 25.6 M (He et al., CVPR 2016; torchvision)
        "yolov3": 0.25,  # YOLOv3 (Darknet-53), 62 M (Redmon & Farhadi, 2018)
        "deepspeech2": 0.15,  # DeepSpeech2 as Pollux runs it, about 38 M (assumed)
        "ncf": 0.01,  # NeuMF on MovieLens, a few M (He et al., WWW 2017)
    }
)
"""Weights of the DeepBoot catalog's inference models, GB (a service's own
``model_gb`` wins)."""


@dataclass(frozen=True, slots=True)
class HostCacheConfig:
    """The host-memory model cache of each node.

    Attributes:
        capacity_gb: GB of host memory per inference node kept for models; 0 = off
            (every start is cold, as DeepBoot's).
        gbps: Host-to-GPU copy bandwidth, GB/s (:data:`DEFAULT_HOST_GBPS`).
        init_s: Fixed seconds of a host start (:data:`DEFAULT_HOST_INIT_S`).
        preload: Stage the services' models in the caches before the first request
            (:meth:`HostCache.preload`), as a serving platform copies a deployed
            model's weights to its nodes' host memory; off: a cache holds only what
            evicted replicas left.

    Raises:
        ConfigError: a value out of range (the message names it).
    """

    capacity_gb: float = 0.0
    gbps: float = DEFAULT_HOST_GBPS
    init_s: float = DEFAULT_HOST_INIT_S
    preload: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.capacity_gb) and self.capacity_gb >= 0):
            raise ConfigError(f"--host-cache-gb must be >= 0 GB; got {self.capacity_gb}")
        if not (math.isfinite(self.gbps) and self.gbps > 0):
            raise ConfigError(f"--host-gbps must be > 0 GB/s; got {self.gbps}")
        if not (math.isfinite(self.init_s) and self.init_s >= 0):
            raise ConfigError(f"--host-init-s must be >= 0 seconds; got {self.init_s}")

    @property
    def enabled(self) -> bool:
        return self.capacity_gb > 0

    def start_s(self, model_gb: float) -> float:
        """Seconds a replica takes to start from the node's cache."""
        return self.init_s + model_gb / self.gbps


class HostCache:
    """Each node's cached models, least recently used first (see the module doc).

    Args:
        config: The cache's settings (its ``capacity_gb`` per node).
        nodes: The nodes that have a cache.
    """

    __slots__ = ("config", "_nodes", "host_starts", "_view")

    def __init__(self, config: HostCacheConfig, nodes: Iterable[int]) -> None:
        self.config = config
        self._nodes: dict[int, OrderedDict[str, float]] = {n: OrderedDict() for n in nodes}
        self.host_starts = 0
        self._view: Mapping[int, frozenset[str]] | None = None

    def view(self) -> Mapping[int, frozenset[str]]:
        """Each node's cached models, read-only (a control loop's ``Snapshot.cached``);
        the same object until a model comes or goes."""
        if self._view is None:
            self._view = MappingProxyType(
                {n: frozenset(models) for n, models in self._nodes.items() if models}
            )
        return self._view

    def holds(self, node: int, model: str) -> bool:
        """Whether ``node``'s cache holds ``model``."""
        cached = self._nodes.get(node)
        return cached is not None and model in cached

    def keep(self, node: int, model: str, gb: float) -> None:
        """An evicted replica leaves ``model`` (``gb``) in ``node``'s cache: it becomes
        the most recently used; the least recently used go until it fits. A model
        larger than the whole cache, or a node without one, keeps nothing."""
        cached = self._nodes.get(node)
        if cached is None or gb > self.config.capacity_gb:
            return
        if model not in cached:
            self._view = None
        cached.pop(model, None)
        used = sum(cached.values())
        while cached and used + gb > self.config.capacity_gb:
            _, freed = cached.popitem(last=False)
            used -= freed
            self._view = None
        cached[model] = gb

    def preload(self, models: Iterable[tuple[str, float]]) -> None:
        """Stage ``models`` (name, GB) before any replica ran: each node in turn takes
        the next models in the given order, wrapping round, until the next one
        would not fit or it holds every model, so that models that do not all fit
        in one node are spread over the nodes (each model on about the same number
        of them) rather than the same few on all. Deterministic; the first model a
        node takes is its least recently used."""
        order = [(m, gb) for m, gb in dict(models).items() if gb <= self.config.capacity_gb]
        if not order:
            return
        nxt = 0
        for node in sorted(self._nodes):
            cached = self._nodes[node]
            used = sum(cached.values())
            for _ in range(len(order)):
                model, gb = order[nxt]
                if model not in cached:
                    if used + gb > self.config.capacity_gb:
                        break
                    cached[model] = gb
                    used += gb
                nxt = (nxt + 1) % len(order)
        self._view = None

    def use(self, node: int, model: str) -> None:
        """A replica started from ``node``'s copy of ``model``: it is the most
        recently used (the copy stays: the weights were copied, not moved)."""
        self._nodes[node].move_to_end(model)
        self.host_starts += 1

    def contents(self, node: int) -> tuple[str, ...]:
        """``node``'s cached models, least recently used first."""
        return tuple(self._nodes.get(node, ()))

    def used_gb(self, node: int) -> float:
        """GB of ``node``'s cache in use (never above ``capacity_gb``)."""
        return sum(self._nodes.get(node, {}).values())
