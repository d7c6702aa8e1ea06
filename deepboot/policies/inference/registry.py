"""Registry of inference-placement policies: names -> factories with typed configs.

The same rules as the training registry (:mod:`deepboot.policies.registry`): every
policy has a frozen dataclass config whose fields all have defaults, and loose keyword
parameters (typed, or strings from a command line) are converted and checked by the
same code, so errors read the same.

Usage::

    from deepboot.policies import inference
    policy = inference.create("ats-i", use_training_pool=False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from deepboot.policies.inference.base import InferencePolicy
from deepboot.policies.registry import PolicyRegistry, load_plugins

ConfigT = TypeVar("ConfigT")


class InferenceRegistry(PolicyRegistry[InferencePolicy]):
    """The generic :class:`~deepboot.policies.registry.PolicyRegistry`, for inference
    placement."""

    def __init__(self) -> None:
        super().__init__("inference policy")


DEFAULT_REGISTRY = InferenceRegistry()
"""Where the built-in inference policies register when their package is imported."""


def register(
    name: str,
    factory: Callable[[ConfigT], InferencePolicy],
    config_cls: type[ConfigT],
) -> None:
    """Register into :data:`DEFAULT_REGISTRY` (see :meth:`PolicyRegistry.register`)."""
    DEFAULT_REGISTRY.register(name, factory, config_cls)


def create(name: str, **params: object) -> InferencePolicy:
    """Build an inference policy from :data:`DEFAULT_REGISTRY`."""
    _load_builtins()
    return DEFAULT_REGISTRY.create(name, **params)


def names() -> list[str]:
    """Names in :data:`DEFAULT_REGISTRY`, sorted."""
    _load_builtins()
    return DEFAULT_REGISTRY.names()


def config_class(name: str) -> type[Any]:
    """Config dataclass of ``name`` in :data:`DEFAULT_REGISTRY`."""
    _load_builtins()
    return DEFAULT_REGISTRY.config_class(name)


def make_config(name: str, **params: object) -> Any:
    """Validated config of ``name`` (see :meth:`PolicyRegistry.make_config`)."""
    _load_builtins()
    return DEFAULT_REGISTRY.make_config(name, **params)


def _load_builtins() -> None:
    # Importing the package registers the built-ins (see the training registry), then
    # the installed plug-ins.
    import deepboot.policies  # noqa: F401
    import deepboot.policies.inference  # noqa: F401

    load_plugins()
