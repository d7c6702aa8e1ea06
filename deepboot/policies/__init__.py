"""Pure decision functions over ClusterState snapshots, and their registry.

The built-in training policies, ``fifo``, ``tiresias``, ``optimus``, ``pollux``,
``deepboot`` (ATS-T), ``afs`` and ``lyra``, are registered by name in
:mod:`deepboot.policies.registry` (one list, not as a side effect of importing them).
Build one with ``deepboot.policies.registry.create(name, **params)``. The inference-placement
policies (ATS-I and variants) live in :mod:`deepboot.policies.inference`, with their
own registry.
"""

from deepboot.policies import afs, deepboot, fifo, inference, lyra, optimus, pollux, tiresias
from deepboot.policies.afs import AfsConfig, AfsPolicy
from deepboot.policies.base import TrainingPolicy
from deepboot.policies.deepboot import DeepBootConfig, DeepBootPolicy
from deepboot.policies.fifo import FifoConfig, FifoPolicy
from deepboot.policies.lifecycle import LifecycleConfig, protect_time
from deepboot.policies.lyra import LyraConfig, LyraPolicy
from deepboot.policies.optimus import OptimusConfig, OptimusPolicy
from deepboot.policies.packing import Packing
from deepboot.policies.pollux import PolluxConfig, PolluxPolicy, pollux_allocate, pollux_fitness
from deepboot.policies.registry import config_class, create, names, register
from deepboot.policies.tiresias import TiresiasConfig, TiresiasPolicy

__all__ = [
    "AfsConfig",
    "AfsPolicy",
    "DeepBootConfig",
    "DeepBootPolicy",
    "LifecycleConfig",
    "LyraConfig",
    "LyraPolicy",
    "afs",
    "deepboot",
    "inference",
    "lyra",
    "protect_time",
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
