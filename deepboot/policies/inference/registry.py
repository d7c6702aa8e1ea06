"""The registry class of inference-placement policies.

The same rules as the training registry (:mod:`deepboot.policies.registration`): every
policy has a frozen dataclass config whose fields all have defaults, and loose keyword
parameters (typed, or strings from a command line) are converted and checked by the
same code, so errors read the same. The default instance, with the built-ins in it,
is :data:`deepboot.policies.registry.INFERENCE_REGISTRY`; build a policy with
``deepboot.policies.inference.create(name, **params)``.
"""

from __future__ import annotations

from deepboot.policies.inference.base import InferencePolicy
from deepboot.policies.registration import PolicyRegistry


class InferenceRegistry(PolicyRegistry[InferencePolicy]):
    """The generic :class:`~deepboot.policies.registration.PolicyRegistry`, for
    inference placement."""

    def __init__(self) -> None:
        super().__init__("inference policy")
