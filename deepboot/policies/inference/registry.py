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

import types
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

from deepboot.core.errors import ConfigError
from deepboot.policies.inference.base import InferencePolicy
from deepboot.policies.registry import PolicyRegistry

ConfigT = TypeVar("ConfigT")


def _config_only(config: object) -> NoReturn:
    # The inner training registry only validates configs; it never builds a policy.
    raise ConfigError(f"{type(config).__name__} configures an inference policy")


class InferenceRegistry:
    """Maps inference-policy names to factories with typed, validated parameters.

    Only :meth:`register` mutates it (the policy modules call it once at import).
    """

    def __init__(self) -> None:
        self._configs = PolicyRegistry()
        self._factories: dict[str, Callable[[Any], InferencePolicy]] = {}

    def register(
        self,
        name: str,
        factory: Callable[[ConfigT], InferencePolicy],
        config_cls: type[ConfigT],
    ) -> None:
        """Register ``factory`` under ``name``.

        Raises:
            ConfigError: ``name`` is taken, or ``config_cls`` is not a frozen dataclass
                whose fields all have defaults.
        """
        self._configs.register(name, _config_only, config_cls)
        self._factories[name] = factory

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return self._configs.names()

    def config_class(self, name: str) -> type[Any]:
        """The config dataclass of ``name``.

        Raises:
            UnknownPolicyError: ``name`` is not registered.
        """
        return self._configs.config_class(name)

    def make_config(self, name: str, **params: object) -> Any:
        """Build and validate the config of ``name`` (strings are converted).

        Raises:
            UnknownPolicyError: ``name`` is not registered.
            ConfigError: a parameter is unknown or invalid; the message names it.
        """
        return self._configs.make_config(name, **params)

    def create(self, name: str, **params: object) -> InferencePolicy:
        """Build policy ``name`` with the given parameters (see :meth:`make_config`).

        Raises:
            UnknownPolicyError: ``name`` is not registered.
            ConfigError: a parameter is unknown or invalid.
        """
        config = self.make_config(name, **params)
        return self._factories[name](config)

    def factories(self) -> Mapping[str, Callable[[Any], InferencePolicy]]:
        """Read-only view of the factories, by name."""
        return types.MappingProxyType(dict(self._factories))


DEFAULT_REGISTRY = InferenceRegistry()
"""Where the built-in inference policies register when their package is imported."""


def register(
    name: str,
    factory: Callable[[ConfigT], InferencePolicy],
    config_cls: type[ConfigT],
) -> None:
    """Register into :data:`DEFAULT_REGISTRY` (see :meth:`InferenceRegistry.register`)."""
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
    """Validated config of ``name`` (see :meth:`InferenceRegistry.make_config`)."""
    _load_builtins()
    return DEFAULT_REGISTRY.make_config(name, **params)


def _load_builtins() -> None:
    # Importing the package registers the built-ins (see the training registry).
    import deepboot.policies.inference  # noqa: F401
