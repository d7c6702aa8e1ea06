"""Work submitted to the cluster: training jobs and inference tasks."""

from __future__ import annotations

from dataclasses import dataclass


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
        service: Service id, e.g. "infer-bert-1" (service 1 of model bert).
        model: Model name of the service (e.g. "bert").
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
    """A loaded workload: training jobs and inference tasks, each sorted by submit time."""

    name: str
    training: tuple[TrainingJobSpec, ...]
    inference: tuple[InferenceTaskSpec, ...] = ()
