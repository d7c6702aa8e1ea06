"""Work submitted to the cluster: training jobs and inference tasks."""

from __future__ import annotations

from dataclasses import dataclass

from deepboot.core.service import ServiceSpec


@dataclass(frozen=True, slots=True)
class TrainingJobSpec:
    """One training job as submitted.

    Attributes:
        name: Unique job name.
        submit_time: Seconds since the start of the trace.
        application: Model name, a key of the application catalog (e.g. "cifar10").
        num_replicas: GPUs the user asked for (used by fixed-size policies).
        batch_size: Total batch size the user asked for (used by fixed-batch policies).
    """

    name: str
    submit_time: float
    application: str
    num_replicas: int
    batch_size: int


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
