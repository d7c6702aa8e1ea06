"""Frozen domain types and typed errors. No I/O, no imports from other layers."""

from deepboot.core.cluster import ClusterSpec, Node, Pool
from deepboot.core.errors import (
    ConfigError,
    DeepbootError,
    InputError,
    InvalidDecisionError,
    SimulationStalledError,
    UnknownPolicyError,
    UnschedulableError,
)
from deepboot.core.gpu import TRANSITIONS, GpuState, GpuView, check_transition
from deepboot.core.jobs import InferenceTaskSpec, TrainingJobSpec, Workload
from deepboot.core.modes import JobMode
from deepboot.core.params import BatchLimits, GradParams, PerfParams
from deepboot.core.placement import EMPTY, Allocation, Placement, freeze_allocation, gpus_used
from deepboot.core.service import ServiceSpec
from deepboot.core.state import ClusterState, InferenceState, JobView

__all__ = [
    "EMPTY",
    "Allocation",
    "BatchLimits",
    "ClusterSpec",
    "ClusterState",
    "ConfigError",
    "DeepbootError",
    "GpuState",
    "GpuView",
    "GradParams",
    "InferenceState",
    "InferenceTaskSpec",
    "InputError",
    "InvalidDecisionError",
    "SimulationStalledError",
    "UnschedulableError",
    "JobMode",
    "JobView",
    "Node",
    "PerfParams",
    "Placement",
    "Pool",
    "ServiceSpec",
    "TRANSITIONS",
    "TrainingJobSpec",
    "UnknownPolicyError",
    "Workload",
    "check_transition",
    "freeze_allocation",
    "gpus_used",
]
