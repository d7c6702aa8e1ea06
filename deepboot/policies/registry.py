"""The default registries: every built-in policy, registered by name in one list.

Two registries (:class:`~deepboot.policies.registration.PolicyRegistry` objects):
:data:`DEFAULT_REGISTRY` for training allocation and :data:`INFERENCE_REGISTRY` for
inference placement. :func:`register_builtins` fills a pair of them explicitly from
:data:`BUILTIN_TRAINING` and :data:`BUILTIN_INFERENCE`; importing a policy module
registers nothing. This module sits above every policy module (it imports them; none
imports it), so the registries and the policies form no import cycle.

Policies written outside the package register through the entry-point group
``deepboot.policies`` (:func:`load_plugins`, ``docs/extending.md``), calling
:func:`register` (training) or ``deepboot.policies.inference.register`` (inference
placement); installed plug-ins are loaded the first time a default registry is asked
for a name.

Usage::

    from deepboot.policies import registry
    policy = registry.create("tiresias", queue_threshold_gpu_hours=8)
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from deepboot.core.errors import ConfigError
from deepboot.policies import afs, deepboot, fifo, lyra, optimus, pollux, sia, tiresias
from deepboot.policies.base import TrainingPolicy
from deepboot.policies.inference import ats_i, lyra_placement, random_placement
from deepboot.policies.inference.base import InferencePolicy
from deepboot.policies.inference.candidates import PlacementConfig
from deepboot.policies.inference.registry import InferenceRegistry
from deepboot.policies.registration import (
    MAX_DELAY_S,
    PolicyEntry,
    PolicyRegistry,
    require,
)

__all__ = [
    "BUILTIN_INFERENCE",
    "BUILTIN_TRAINING",
    "DEFAULT_REGISTRY",
    "INFERENCE_REGISTRY",
    "MAX_DELAY_S",
    "PLUGIN_GROUP",
    "PolicyEntry",
    "PolicyRegistry",
    "config_class",
    "create",
    "entries",
    "inference_config_class",
    "inference_create",
    "inference_make_config",
    "inference_names",
    "load_plugins",
    "make_config",
    "names",
    "register",
    "register_builtins",
    "register_inference",
    "require",
]

log = logging.getLogger(__name__)

ConfigT = TypeVar("ConfigT")

PLUGIN_GROUP = "deepboot.policies"
"""Entry-point group of out-of-tree policies (``docs/extending.md``)."""

Builtin = tuple[str, Callable[[Any], Any], type[Any]]

BUILTIN_TRAINING: tuple[Builtin, ...] = (
    ("afs", afs.AfsPolicy, afs.AfsConfig),
    ("deepboot", deepboot.DeepBootPolicy, deepboot.DeepBootConfig),
    ("fifo", fifo.FifoPolicy, fifo.FifoConfig),
    ("lyra", lyra.LyraPolicy, lyra.LyraConfig),
    ("optimus", optimus.OptimusPolicy, optimus.OptimusConfig),
    ("pollux", pollux.PolluxPolicy, pollux.PolluxConfig),
    ("sia", sia.SiaPolicy, sia.SiaConfig),
    ("tiresias", tiresias.TiresiasPolicy, tiresias.TiresiasConfig),
)
"""The built-in training policies: (name, factory from its config, config class)."""

BUILTIN_INFERENCE: tuple[Builtin, ...] = (
    ("ats-i", ats_i.AtsIPolicy, PlacementConfig),
    ("ats-i-pack", ats_i.AtsIPolicy, ats_i.PackedPlacementConfig),
    ("lyra", lyra_placement.LyraPlacementPolicy, PlacementConfig),
    ("random", random_placement.RandomPlacementPolicy, PlacementConfig),
)
"""The built-in inference-placement policies, as :data:`BUILTIN_TRAINING`."""


def register_builtins(
    training: PolicyRegistry[TrainingPolicy], inference: PolicyRegistry[InferencePolicy]
) -> None:
    """Register every built-in policy into ``training`` and ``inference``.

    Raises:
        ConfigError: a name is already registered in one of them.
    """
    for name, factory, config_cls in BUILTIN_TRAINING:
        training.register(name, factory, config_cls)
    for name, factory, config_cls in BUILTIN_INFERENCE:
        inference.register(name, factory, config_cls)


DEFAULT_REGISTRY: PolicyRegistry[TrainingPolicy] = PolicyRegistry("policy")
"""The training policies: the built-ins, then the plug-ins once a lookup loads them."""

INFERENCE_REGISTRY: PolicyRegistry[InferencePolicy] = InferenceRegistry()
"""The inference-placement policies, as :data:`DEFAULT_REGISTRY`."""

register_builtins(DEFAULT_REGISTRY, INFERENCE_REGISTRY)


def load_plugins() -> None:
    """Load every installed plug-in of the ``deepboot.policies`` entry-point group, once.

    An entry point names a callable (``package.module:register``), called with no
    arguments, or a module, imported; either registers its policies with
    :func:`register` (training) or ``deepboot.policies.inference.register``
    (inference placement).

    Raises:
        ConfigError: a plug-in failed to load; the message names it.
    """
    if DEFAULT_REGISTRY.plugins_loaded:
        return
    DEFAULT_REGISTRY.plugins_loaded = True
    for ep in sorted(importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            target = ep.load()
            if callable(target):
                target()
        except ConfigError as exc:
            raise ConfigError(f"plug-in {ep.name!r} ({ep.value}): {exc}") from exc
        except Exception as exc:  # a broken plug-in must not read as deepboot's bug
            raise ConfigError(
                f"plug-in {ep.name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        log.debug("loaded policy plug-in %s (%s)", ep.name, ep.value)


# -- training policies --------------------------------------------------------------


def register(
    name: str,
    factory: Callable[[ConfigT], TrainingPolicy],
    config_cls: type[ConfigT],
) -> None:
    """Register into :data:`DEFAULT_REGISTRY` (see :meth:`PolicyRegistry.register`)."""
    DEFAULT_REGISTRY.register(name, factory, config_cls)


def create(name: str, **params: object) -> TrainingPolicy:
    """Build a policy from :data:`DEFAULT_REGISTRY` (see :meth:`PolicyRegistry.create`)."""
    load_plugins()
    return DEFAULT_REGISTRY.create(name, **params)


def names() -> list[str]:
    """Names in :data:`DEFAULT_REGISTRY`, sorted."""
    load_plugins()
    return DEFAULT_REGISTRY.names()


def config_class(name: str) -> type[Any]:
    """Config dataclass of ``name`` in :data:`DEFAULT_REGISTRY`."""
    load_plugins()
    return DEFAULT_REGISTRY.config_class(name)


def make_config(name: str, **params: object) -> Any:
    """Validated config of ``name`` (see :meth:`PolicyRegistry.make_config`)."""
    load_plugins()
    return DEFAULT_REGISTRY.make_config(name, **params)


def entries() -> Mapping[str, PolicyEntry[Any, TrainingPolicy]]:
    """Read-only view of the default registry's entries, by name."""
    load_plugins()
    return DEFAULT_REGISTRY.entries()


# -- inference-placement policies (``deepboot.policies.inference`` re-exports these) --


def register_inference(
    name: str,
    factory: Callable[[ConfigT], InferencePolicy],
    config_cls: type[ConfigT],
) -> None:
    """Register into :data:`INFERENCE_REGISTRY` (see :meth:`PolicyRegistry.register`)."""
    INFERENCE_REGISTRY.register(name, factory, config_cls)


def inference_create(name: str, **params: object) -> InferencePolicy:
    """Build an inference policy from :data:`INFERENCE_REGISTRY`."""
    load_plugins()
    return INFERENCE_REGISTRY.create(name, **params)


def inference_names() -> list[str]:
    """Names in :data:`INFERENCE_REGISTRY`, sorted."""
    load_plugins()
    return INFERENCE_REGISTRY.names()


def inference_config_class(name: str) -> type[Any]:
    """Config dataclass of ``name`` in :data:`INFERENCE_REGISTRY`."""
    load_plugins()
    return INFERENCE_REGISTRY.config_class(name)


def inference_make_config(name: str, **params: object) -> Any:
    """Validated config of inference policy ``name``."""
    load_plugins()
    return INFERENCE_REGISTRY.make_config(name, **params)
