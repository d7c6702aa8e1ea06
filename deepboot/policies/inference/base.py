"""The contract every inference-placement policy implements (ATS-I and variants)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from deepboot.core.errors import ConfigError, InvalidDecisionError
from deepboot.core.gpu import GpuId
from deepboot.core.state import InferenceState


class PlaceAction(enum.Enum):
    """How an inference task gets its GPU (DeepBoot §2.2, in ATS-I's order).

    WARM_PROTECT: reuse an idle replica of the same service in PROTECT (no cold start;
        its hit count grows).
    WARM_SLEEP: reuse a SLEEP replica of the same service (no cold start; hits reset).
    COLD_FREE: cold-start on a FREE GPU.
    COLD_EVICT: evict another service's SLEEP replica, then cold-start there.
    COLD_RECLAIM: take GPUs back from training (``reclaims``), cold-start on one.
    """

    WARM_PROTECT = "warm_protect"
    WARM_SLEEP = "warm_sleep"
    COLD_FREE = "cold_free"
    COLD_EVICT = "cold_evict"
    COLD_RECLAIM = "cold_reclaim"

    @property
    def warm(self) -> bool:
        """Whether the task starts without a cold start."""
        return self in (PlaceAction.WARM_PROTECT, PlaceAction.WARM_SLEEP)


@dataclass(frozen=True, slots=True)
class InferencePlacement:
    """Where one inference task runs, and what must happen first.

    Attributes:
        gpu: (node_id, index) of the GPU the task runs on.
        action: How it gets that GPU.
        reclaims: ((gpu, job name), ...) LENT GPUs taken back from training jobs: one
            for ATS-I, possibly a whole node for the Lyra-style variant. For
            COLD_RECLAIM ``gpu`` is one of them; empty for every other action.
        evicts: SLEEP replicas evicted: ``(gpu,)`` for COLD_EVICT, else empty. A
            replica of several GPUs is evicted whole: every one of its GPUs is
            listed (then ``gpu``, or some GPU of ``gpus``, is among them).
        gpus: Every GPU of the task's replica when its service spans several
            (``gpus_per_replica`` > 1): distinct GPUs of one node in index order,
            ``gpu`` (the lead) first; each one FREE, or among ``evicts``, or
            reclaimed (a new replica: the action is the latest step it needed,
            COLD_RECLAIM over COLD_EVICT over COLD_FREE), or the GPUs of the
            same service's idle replica (warm reuse). Empty for a one-GPU replica.

    Raises:
        InvalidDecisionError: the fields disagree with ``action``.
    """

    gpu: GpuId
    action: PlaceAction
    reclaims: tuple[tuple[GpuId, str], ...] = ()
    evicts: tuple[GpuId, ...] = ()
    gpus: tuple[GpuId, ...] = ()

    @property
    def members(self) -> tuple[GpuId, ...]:
        """Every GPU of the task's replica, lead first."""
        return self.gpus or (self.gpu,)

    def __post_init__(self) -> None:
        reclaimed = [g for g, _ in self.reclaims]
        if len(set(reclaimed)) != len(reclaimed):
            raise InvalidDecisionError(f"a GPU is reclaimed twice: {reclaimed}")
        if self.gpus:
            self._check_set(reclaimed)
            return
        if self.action is PlaceAction.COLD_RECLAIM:
            if self.gpu not in reclaimed:
                raise InvalidDecisionError(f"COLD_RECLAIM on {self.gpu} must reclaim that GPU")
        elif self.reclaims:
            raise InvalidDecisionError(f"{self.action.name} must not reclaim GPUs")
        if self.action is PlaceAction.COLD_EVICT:
            if self.gpu not in self.evicts:
                raise InvalidDecisionError(f"COLD_EVICT on {self.gpu} evicts exactly its replica")
        elif self.evicts:
            raise InvalidDecisionError(f"{self.action.name} must not evict replicas")

    def _check_set(self, reclaimed: list[GpuId]) -> None:
        """The rules of a replica of several GPUs (see ``gpus``)."""
        ids = self.gpus
        if (
            ids[0] != self.gpu
            or len(set(ids)) != len(ids)
            or list(ids) != sorted(ids)
            or len({g[0] for g in ids}) != 1
        ):
            raise InvalidDecisionError(
                f"a replica's GPUs {ids} must be distinct GPUs of one node in index order, "
                f"{self.gpu} first"
            )
        if self.action is PlaceAction.COLD_RECLAIM:
            if not set(reclaimed) & set(ids):
                raise InvalidDecisionError(f"COLD_RECLAIM of {ids} reclaims none of them")
        elif self.reclaims:
            raise InvalidDecisionError(f"{self.action.name} must not reclaim GPUs")
        if self.action is PlaceAction.COLD_EVICT:
            if not set(self.evicts) & set(ids):
                raise InvalidDecisionError(f"COLD_EVICT of {ids} evicts none of them")
        elif self.action.warm and self.evicts:
            raise InvalidDecisionError(f"{self.action.name} must not evict replicas")
        if set(self.evicts) & set(reclaimed):
            raise InvalidDecisionError("a GPU is both evicted and reclaimed")


class InferencePolicy(Protocol):
    """A pure placement function over an immutable :class:`InferenceState`.

    ``place`` must:
      * never mutate ``state``;
      * return a GPU that exists, never one RUNNING, never a TRAINING one, never a
        PROTECT or SLEEP replica of another service except by evicting a SLEEP one;
      * reuse a same-service PROTECT/SLEEP replica whenever one exists;
      * reclaim only when no FREE or SLEEP GPU it may use exists and
        ``state.lending`` is True, and only LENT GPUs, each named with its job;
      * be deterministic given the state and the generator's seed.
    """

    @property
    def name(self) -> str:
        """Registry name of the policy."""
        ...

    def place(
        self, state: InferenceState, service: str, rng: np.random.Generator
    ) -> InferencePlacement | None:
        """Where a task of ``service`` runs now, or None (no GPU can take it; it waits)."""
        ...


def refuse_multi(policy: str, state: InferenceState, service: str) -> None:
    """Refuse a task whose replica spans several GPUs, for a policy that places
    one-GPU replicas only.

    Raises:
        ConfigError: ``state.gpus_per_replica`` > 1, naming the policy and the service.
    """
    if state.gpus_per_replica > 1:
        raise ConfigError(
            f"inference policy {policy!r} places one-GPU replicas only; service "
            f"{service!r} has gpus_per_replica = {state.gpus_per_replica}: use ats-i or "
            "ats-i-pack"
        )
