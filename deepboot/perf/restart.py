"""Restart-cost models: seconds a job holds its GPUs without progress after a change.

* :class:`FlatRestartCost`: the Pollux fidelity runs; every placement change, the first
  start included, costs a flat delay (the reference's ``rescale_time = 30``).
* :class:`AfeRestartCost`: DeepBoot's per-model cold-start / AFE table (ALGORITHMS.md
  §2.5). With AFE, a scale-down costs the AFE delay, a scale-up by d GPUs to K costs
  ``afe + (cold - afe) * d / K`` (only the new workers cold-start), and a same-size
  move or the first start costs the cold delay. Without AFE every change is cold.

Each job picks how a model is applied to it (:func:`job_restart_delay`): an AFE job
(``TrainingJobSpec.resize == "afe"``, the default) pays what the model charges; a
``"restart"`` job restarts from a checkpoint on every change, so every change costs
it a full start: its own ``restart_cost`` when given, else what the model charges a
start of its application from no GPUs (AfeRestartCost: the cold delay, with or
without AFE; FlatRestartCost: the flat delay). :func:`job_resize_cost` is the one
number a policy sees of it (``JobView.restart_cost``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from deepboot.core.errors import ConfigError
from deepboot.core.jobs import TrainingJobSpec


class RestartCostModel(Protocol):
    """Delay of one placement change of a training job."""

    def delay(
        self, application: str, old_replicas: int, new_replicas: int, first_start: bool
    ) -> float:
        """Seconds of no progress after moving from ``old_replicas`` to ``new_replicas``.

        Args:
            application: Model name of the job.
            old_replicas: GPUs before the change (0 when starting or resuming).
            new_replicas: GPUs after the change (>= 1).
            first_start: The job's very first start.
        """
        ...


@dataclass(frozen=True, slots=True)
class RestartDelays:
    """Cold (full restart from a checkpoint) and AFE (keep-alive resize) delays, seconds."""

    cold: float
    afe: float

    def __post_init__(self) -> None:
        if not 0 <= self.afe <= self.cold:
            raise ConfigError(f"restart delays need 0 <= afe <= cold; got {self.afe}, {self.cold}")


DEEPBOOT_RESTART_TABLE: Mapping[str, RestartDelays] = MappingProxyType(
    {
        "bert": RestartDelays(cold=103.0, afe=5.0),
        "cifar10": RestartDelays(cold=24.0, afe=3.0),
        "ncf": RestartDelays(cold=25.0, afe=2.0),
        "deepspeech2": RestartDelays(cold=18.0, afe=1.0),
        "yolov3": RestartDelays(cold=26.0, afe=3.0),
        "imagenet": RestartDelays(cold=35.0, afe=3.0),
    }
)
"""DeepBoot's measured delays (TPDS'23; ALGORITHMS.md §2.5)."""

SIA_RESTART_TABLE: Mapping[str, RestartDelays] = MappingProxyType(
    {
        name: RestartDelays(cold=seconds, afe=seconds)
        for name, seconds in (
            ("cifar10", 50.0),
            ("deepspeech2", 25.0),
            ("bert", 120.0),
            ("yolov3", 80.0),
            ("imagenet", 250.0),
            ("ncf", 15.0),
        )
    }
)
"""The per-model restart delays of Sia's simulator (SOSP'23; its artifact's
``applications.py``), charged on every change of a job's GPUs, its first start and a
change of type included; 30 s for any other model (:func:`sia_restart_cost`)."""

SIA_SLOWDOWNS: Mapping[str, float] = MappingProxyType(
    {"cifar10": 1.8, "ncf": 1.5, "bert": 1.2, "deepspeech2": 1.2, "yolov3": 1.2, "imagenet": 1.2}
)
"""The per-model slowdowns of Sia's simulator: a real run's goodput was this many
times below its profile's (fitted by Sia's authors to their testbed runs); its
simulated progress is divided by them, whatever the policy."""


@dataclass(frozen=True, slots=True)
class FlatRestartCost:
    """Every placement change, the first start included, costs ``seconds``."""

    seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.seconds < 0:
            raise ConfigError(f"restart seconds must be >= 0; got {self.seconds}")

    def delay(
        self, application: str, old_replicas: int, new_replicas: int, first_start: bool
    ) -> float:
        """The flat delay, whatever the change."""
        return self.seconds


@dataclass(frozen=True, slots=True)
class AfeRestartCost:
    """DeepBoot's cold/AFE restart cost (see the module docstring).

    Attributes:
        table: Model name -> delays.
        afe: Whether AFE (keep-alive resize) is enabled.
        default: Delays of a model missing from ``table`` (None: such a model is a
            ConfigError when its delay is asked for).
    """

    table: Mapping[str, RestartDelays] = field(default_factory=lambda: DEEPBOOT_RESTART_TABLE)
    afe: bool = True
    default: RestartDelays | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.table, MappingProxyType):
            object.__setattr__(self, "table", MappingProxyType(dict(self.table)))

    def delays(self, application: str) -> RestartDelays:
        """The delays of ``application``.

        Raises:
            ConfigError: the model is not in the table and there is no default.
        """
        found = self.table.get(application, self.default)
        if found is None:
            known = ", ".join(sorted(self.table))
            raise ConfigError(f"no restart delays for model {application!r}; known: {known}")
        return found

    def delay(
        self, application: str, old_replicas: int, new_replicas: int, first_start: bool
    ) -> float:
        """Cold for a first start, a restart from 0 GPUs, a same-size move or no AFE;
        otherwise the AFE resize cost.

        Raises:
            ConfigError: the model is unknown (see :meth:`delays`).
            ValueError: ``new_replicas`` < 1 or ``old_replicas`` < 0.
        """
        if new_replicas < 1 or old_replicas < 0:
            raise ValueError(f"bad replica counts {old_replicas} -> {new_replicas}")
        d = self.delays(application)
        # A job resumed from 0 GPUs has no live worker to keep: it restarts cold.
        if not self.afe or first_start or old_replicas == 0 or old_replicas == new_replicas:
            return d.cold
        if new_replicas < old_replicas:
            return d.afe
        grown = new_replicas - old_replicas
        return d.afe + (d.cold - d.afe) * grown / new_replicas


def sia_restart_cost() -> AfeRestartCost:
    """Sia's simulator's restart costs: :data:`SIA_RESTART_TABLE`, no AFE, 30 s for any
    other model."""
    return AfeRestartCost(SIA_RESTART_TABLE, afe=False, default=RestartDelays(30.0, 30.0))


def job_restart_delay(
    model: RestartCostModel,
    job: TrainingJobSpec,
    old_replicas: int,
    new_replicas: int,
    first_start: bool,
) -> float:
    """Seconds of no progress of ``job`` after one placement change, by its resize mode.

    An AFE job pays ``model.delay(...)`` as is. A ``"restart"`` job stops every worker
    and restarts from a checkpoint, so every change, its first start included, is a
    full start: its ``restart_cost`` when given, else ``model.delay(application, 0,
    new_replicas, first_start)`` (what the model charges a start from no GPUs).

    Args:
        model: The run's restart-cost model.
        job: The job (its application, resize mode and restart cost).
        old_replicas: GPUs before the change (0 when starting or resuming).
        new_replicas: GPUs after the change (>= 1).
        first_start: The job's very first start.

    Raises:
        What ``model.delay`` raises (an unknown model, bad replica counts).
    """
    if job.resize == "restart":
        if job.restart_cost is not None:
            if new_replicas < 1 or old_replicas < 0:
                raise ValueError(f"bad replica counts {old_replicas} -> {new_replicas}")
            return job.restart_cost
        return model.delay(job.application, 0, new_replicas, first_start)
    return model.delay(job.application, old_replicas, new_replicas, first_start)


def job_resize_cost(model: RestartCostModel, job: TrainingJobSpec) -> float | None:
    """Seconds one resize of ``job`` costs, as a policy sees it (``JobView.restart_cost``).

    None for an AFE job: the policies' default deltas are calibrated for the runs where
    every job resizes alike, and every result without per-job modes keeps them. A
    ``"restart"`` job: what :func:`job_restart_delay` charges it for a restart on the
    GPUs it asked for (its ``restart_cost``, else the model's start of its application:
    the cold delay of :class:`AfeRestartCost`).

    Raises:
        What ``model.delay`` raises (an unknown model).
    """
    if job.resize != "restart":
        return None
    return job_restart_delay(model, job, 0, max(job.num_replicas, 1), False)
