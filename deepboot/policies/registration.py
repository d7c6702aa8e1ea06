"""The generic policy registry: names -> factories with typed, validated configs.

One :class:`PolicyRegistry` class serves both kinds of policy, training allocation and
inference placement. Every policy has a frozen dataclass config; :meth:`PolicyRegistry.create`
turns loose keyword parameters (typed values, or strings from a command line) into
that config, checks every field, and builds the policy from it. Nothing here inspects
a policy's type, and nothing here knows a policy: the built-ins are registered, by
name and in one list, in :mod:`deepboot.policies.registry`, which sits above every
policy module (so none of them imports it).

:func:`require` and :data:`MAX_DELAY_S` are the configs' shared validation.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from deepboot.core.errors import ConfigError, UnknownPolicyError

ConfigT = TypeVar("ConfigT")
P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class PolicyEntry(Generic[ConfigT, P]):
    """One registered policy: its name, its config class and its factory."""

    name: str
    config_cls: type[ConfigT]
    factory: Callable[[ConfigT], P]


class PolicyRegistry(Generic[P]):
    """Maps policy names to factories with typed, validated parameters.

    A registry is only mutated by :meth:`register` (the built-in list in
    :mod:`deepboot.policies.registry`, and plug-ins), once per name; lookups never
    mutate it.

    Args:
        kind: What its policies are, for messages ("policy", "inference policy").
    """

    def __init__(self, kind: str = "policy") -> None:
        self.kind = kind
        self._entries: dict[str, PolicyEntry[Any, P]] = {}
        self.plugins_loaded = False

    def register(
        self,
        name: str,
        factory: Callable[[ConfigT], P],
        config_cls: type[ConfigT],
    ) -> None:
        """Register ``factory`` under ``name``.

        Args:
            name: Lower-case policy name, unique in this registry.
            factory: Builds the policy from a ``config_cls`` instance.
            config_cls: A frozen dataclass whose fields all have defaults.

        Raises:
            ConfigError: ``name`` is taken, or ``config_cls`` is not a frozen dataclass
                whose fields all have defaults.
        """
        if name in self._entries:
            raise ConfigError(f"{self.kind} {name!r} is already registered")
        if not dataclasses.is_dataclass(config_cls) or not _is_frozen(config_cls):
            raise ConfigError(f"config of {self.kind} {name!r} must be a frozen dataclass")
        for f in dataclasses.fields(config_cls):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"config field {name}.{f.name} needs a default")
        self._entries[name] = PolicyEntry(name, config_cls, factory)

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def config_class(self, name: str) -> type[Any]:
        """The config dataclass of policy ``name``.

        Raises:
            UnknownPolicyError: ``name`` is not registered.
        """
        return self._entry(name).config_cls

    def make_config(self, name: str, **params: object) -> Any:
        """Build and validate the config of ``name`` from keyword parameters.

        Strings are converted to the field's type (int, float, bool, enum by value or
        name), so command-line values can be passed as they are.

        Raises:
            UnknownPolicyError: ``name`` is not registered.
            ConfigError: a parameter is unknown, has the wrong type, or a bad value;
                the message names the parameter.
        """
        entry = self._entry(name)
        cls = entry.config_cls
        hints = typing.get_type_hints(cls)
        known = [f.name for f in dataclasses.fields(cls)]
        converted: dict[str, object] = {}
        for key, value in params.items():
            if key not in known:
                listing = ", ".join(known) or "none"
                raise ConfigError(
                    f"unknown parameter {key!r} for {self.kind} {name!r}; "
                    f"known parameters: {listing}"
                )
            converted[key] = _convert(f"{name}.{key}", hints[key], value)
        try:
            return cls(**converted)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad parameters for {self.kind} {name!r}: {exc}") from exc

    def create(self, name: str, **params: object) -> P:
        """Build policy ``name`` with the given parameters (see :meth:`make_config`).

        Raises:
            UnknownPolicyError: ``name`` is not registered.
            ConfigError: a parameter is unknown or invalid.
        """
        config = self.make_config(name, **params)
        return self._entry(name).factory(config)

    def factories(self) -> Mapping[str, Callable[[Any], P]]:
        """Read-only view of the factories, by name."""
        return types.MappingProxyType({n: e.factory for n, e in self._entries.items()})

    def entries(self) -> Mapping[str, PolicyEntry[Any, P]]:
        """Read-only view of the entries, by name."""
        return types.MappingProxyType(dict(self._entries))

    def _entry(self, name: str) -> PolicyEntry[Any, P]:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise UnknownPolicyError(f"unknown {self.kind} {name!r}; known: {known}") from None


def _is_frozen(cls: type[Any]) -> bool:
    params = getattr(cls, "__dataclass_params__", None)
    return bool(getattr(params, "frozen", False))


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(field: str, tp: Any, value: object) -> object:
    """Convert ``value`` to type ``tp`` or raise a ConfigError naming ``field``."""
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _convert_enum(field, tp, value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"parameter {field} must be a boolean; got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"parameter {field} must be an integer; got {value!r}")
    if tp is float:
        out: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            out = float(value)
        elif isinstance(value, str):
            try:
                out = float(value.strip())
            except ValueError:
                out = None
        if out is None or math.isnan(out):
            raise ConfigError(f"parameter {field} must be a number; got {value!r}")
        return out
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"parameter {field} must be a string; got {value!r}")
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        # Only ``X | None`` is supported: None passes, anything else converts to X.
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
            return None
        if len(args) == 1:
            return _convert(field, args[0], value)
    # Types this converter does not know are passed through; the config validates them.
    return value


def _convert_enum(field: str, tp: type[enum.Enum], value: object) -> enum.Enum:
    if isinstance(value, tp):
        return value
    if isinstance(value, str):
        text = value.strip()
        for member in tp:
            if text.lower() in (str(member.value).lower(), member.name.lower()):
                return member
    choices = ", ".join(str(m.value) for m in tp)
    raise ConfigError(f"parameter {field} must be one of: {choices}; got {value!r}")


MAX_DELAY_S = 86_400.0
"""Upper bound of every delay, protect time and window parameter (one day): larger
values stop a simulation from scheduling anything in any horizon a trace covers."""


def require(ok: bool, field: str, message: str) -> None:
    """Raise ``ConfigError`` naming ``field`` unless ``ok`` (for configs' __post_init__)."""
    if not ok:
        raise ConfigError(f"parameter {field} {message}")
