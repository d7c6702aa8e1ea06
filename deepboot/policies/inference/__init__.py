"""Inference-placement policies (ATS-I and its variants) and their registry.

The built-ins ``ats-i``, ``ats-i-pack``, ``random`` and ``lyra`` are registered in
:data:`deepboot.policies.registry.INFERENCE_REGISTRY`. Build one with
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
from deepboot.policies.inference.registry import InferenceRegistry
from deepboot.policies.registry import inference_config_class as config_class
from deepboot.policies.registry import inference_create as create
from deepboot.policies.registry import inference_make_config as make_config
from deepboot.policies.registry import inference_names as names
from deepboot.policies.registry import register_inference as register

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
