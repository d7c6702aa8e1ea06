"""Pure decision functions over ClusterState snapshots, and their registry.

Importing this package registers the built-in training policies: ``fifo``,
``tiresias``, ``optimus`` and ``pollux``. Build one with
``deepboot.policies.registry.create(name, **params)``.
"""

from deepboot.policies import fifo, optimus, pollux, tiresias
from deepboot.policies.base import TrainingPolicy
from deepboot.policies.fifo import FifoConfig, FifoPolicy
from deepboot.policies.optimus import OptimusConfig, OptimusPolicy
from deepboot.policies.packing import Packing
from deepboot.policies.pollux import PolluxConfig, PolluxPolicy, pollux_allocate, pollux_fitness
from deepboot.policies.registry import config_class, create, names, register
from deepboot.policies.tiresias import TiresiasConfig, TiresiasPolicy

__all__ = [
    "FifoConfig",
    "FifoPolicy",
    "OptimusConfig",
    "OptimusPolicy",
    "Packing",
    "PolluxConfig",
    "PolluxPolicy",
    "TiresiasConfig",
    "TiresiasPolicy",
    "TrainingPolicy",
    "config_class",
    "create",
    "fifo",
    "names",
    "optimus",
    "pollux",
    "pollux_allocate",
    "pollux_fitness",
    "register",
    "tiresias",
]
