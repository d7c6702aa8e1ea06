"""``--param key=value`` parsing and policy-parameter introspection for the CLI.

Values stay strings: :func:`deepboot.policies.registry.create` converts and validates
them against the policy's config dataclass.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Sequence
from typing import Any

from deepboot.core.errors import ConfigError


def split_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``.

    Raises:
        ConfigError: an item has no ``=`` or an empty key, or a key repeats.
    """
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--param {pair!r} is not key=value")
        if key in out:
            raise ConfigError(f"--param {key} is given twice")
        out[key] = value.strip()
    return out


def parameter_fields(config_cls: object) -> dict[str, tuple[Any, Any]]:
    """``{name: (type, default)}`` of a dataclass config; ``{}`` if it is not one.

    A field without a default has :data:`dataclasses.MISSING` as its default.
    """
    if not (isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls)):
        return {}
    try:
        hints = typing.get_type_hints(config_cls)
    except (NameError, TypeError):
        hints = {}
    out: dict[str, tuple[Any, Any]] = {}
    for f in dataclasses.fields(config_cls):
        if not f.init:
            continue
        default: Any = f.default
        factory = f.default_factory
        if default is dataclasses.MISSING and callable(factory):
            default = factory()
        out[f.name] = (hints.get(f.name, f.type), default)
    return out


def type_name(tp: Any) -> str:
    """Short readable name of a type annotation (``int``, ``float | None``...)."""
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def describe(tp: Any, default: Any) -> str:
    """``"int = 16"``; enums list their values: ``"Packing (best_fit|most_free) = best_fit"``."""
    text = type_name(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        text += " (" + "|".join(str(m.value) for m in tp) + ")"
    if default is dataclasses.MISSING:
        return text
    shown = default.value if isinstance(default, enum.Enum) else default
    return f"{text} = {shown}"
