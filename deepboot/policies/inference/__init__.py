"""Inference-placement policies (ATS-I and its variants) and their registry.

Importing this package registers ``ats-i``, ``random`` and ``lyra``. Build one with
``deepboot.policies.inference.create(name, **params)``; every one takes a
:class:`PlacementConfig`.
"""

from deepboot.core.gpu import GpuId
from deepboot.policies.inference import ats_i, lyra_placement, random_placement
from deepboot.policies.inference.ats_i import AtsIPolicy
from deepboot.policies.inference.base import (
    InferencePlacement,
    InferencePolicy,
    PlaceAction,
)
from deepboot.policies.inference.candidates import PlacementConfig, reclaim_losses
from deepboot.policies.inference.lyra_placement import LyraPlacementPolicy
from deepboot.policies.inference.random_placement import RandomPlacementPolicy
from deepboot.policies.inference.registry import (
    InferenceRegistry,
    config_class,
    create,
    make_config,
    names,
    register,
)

__all__ = [
    "AtsIPolicy",
    "GpuId",
    "InferencePlacement",
    "InferencePolicy",
    "InferenceRegistry",
    "LyraPlacementPolicy",
    "PlaceAction",
    "PlacementConfig",
    "RandomPlacementPolicy",
    "ats_i",
    "config_class",
    "create",
    "lyra_placement",
    "make_config",
    "names",
    "random_placement",
    "reclaim_losses",
    "register",
]
