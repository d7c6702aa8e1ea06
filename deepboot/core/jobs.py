"""Work submitted to the cluster: training jobs and inference tasks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from deepboot.core.service import ServiceSpec

ResizeMode: TypeAlias = Literal["afe", "restart"]
"""How a training job changes size.

``"afe"``: keep-alive resize (the surviving workers keep their process and state; the
restart-cost model prices each change). ``"restart"``: every change stops all workers
and restarts the job from a checkpoint (a full restart, the cold delay)."""

RESIZE_MODES: Final[tuple[ResizeMode, ...]] = ("afe", "restart")
"""The valid values of :attr:`TrainingJobSpec.resize`, the default first."""


@dataclass(frozen=True, slots=True)
class TrainingJobSpec:
    """One training job as submitted.

    Attributes:
        name: Unique job name.
        submit_time: Seconds since the start of the trace.
        application: Model name, a key of the application catalog (e.g. "cifar10").
        num_replicas: GPUs the user asked for (used by fixed-size policies).
        batch_size: Total batch size the user asked for (used by fixed-batch policies).
        resize: How the job changes size (:data:`ResizeMode`): ``"afe"`` (the
            default) or ``"restart"``.
        restart_cost: Seconds one full restart of the job costs, for a ``"restart"``
            job only: it then pays this on every placement change, its first start
            included (None: what the restart-cost model charges a start of its
            application). Finite and >= 0.

    Raises:
        ValueError: ``resize`` is not a :data:`ResizeMode`, ``restart_cost`` is
            negative or not finite, or it is given for an ``"afe"`` job (whose
            changes the restart-cost model prices).
    """

    name: str
    submit_time: float
    application: str
    num_replicas: int
    batch_size: int
    resize: ResizeMode = "afe"
    restart_cost: float | None = None

    def __post_init__(self) -> None:
        if self.resize not in RESIZE_MODES:
            raise ValueError(
                f"job {self.name!r}: resize must be one of {', '.join(RESIZE_MODES)}; "
                f"got {self.resize!r}"
            )
        if self.restart_cost is not None:
            if not (math.isfinite(self.restart_cost) and self.restart_cost >= 0):
                raise ValueError(
                    f"job {self.name!r}: restart_cost must be a finite number of seconds "
                    f">= 0; got {self.restart_cost}"
                )
            if self.resize != "restart":
                raise ValueError(
                    f"job {self.name!r}: restart_cost is for resize='restart' jobs only "
                    "(an AFE job's changes are priced by the restart-cost model)"
                )


@dataclass(frozen=True, slots=True)
class InferenceTaskSpec:
    """One inference task from a DeepBoot workload.

    Attributes:
        name: Unique task name.
        submit_time: Seconds since the start of the trace.
        service: Service id: "infer-bert-1" (service 1 of model bert, without a
            services file), or the name of a service of the services file the
            workload was read with (its row says ``infer-<name>``).
        model: Model name of the service: a catalog key ("bert") without a services
            file, else the service's ``model``, a label.
        duration: Seconds the task holds one GPU once started.
        num_task: Request count carried by the task (informational).
    """

    name: str
    submit_time: float
    service: str
    model: str
    duration: float
    num_task: int


@dataclass(frozen=True, slots=True)
class Workload:
    """A loaded workload: training jobs and inference tasks, each sorted by submit time.

    Attributes:
        name: Its name (the file's stem).
        training: Training jobs.
        inference: Inference tasks.
        services: The specs of the services its tasks name, in order of first use,
            when it was read with a services file (cold start, concurrency,
            max_replicas); empty: the simulator derives each service's spec from its
            model (per-model cold starts, one task per replica, no cap).
    """

    name: str
    training: tuple[TrainingJobSpec, ...]
    inference: tuple[InferenceTaskSpec, ...] = ()
    services: tuple[ServiceSpec, ...] = ()
