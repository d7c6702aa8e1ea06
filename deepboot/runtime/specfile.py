"""What job files and service files share: reading TOML, integer keys, and the
"file.py:function" / "package.module:function" references to user code.

Every error is an :class:`~deepboot.core.errors.InputError` naming the file (or the
endpoint a spec came through) and the key; TOML syntax errors carry the line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepboot.core.errors import InputError
from deepboot.core.service import valid_name
from deepboot.core.servicefile import read_toml as core_read_toml


def read_toml(path: str | Path, what: str) -> tuple[dict[str, Any], str, Path]:
    """The table of a TOML file, the name to put in errors, and the file's directory.

    Args:
        path: The file.
        what: What it is, for the message of an unreadable file ("job", "service").
    """
    raw, _ = core_read_toml(path, what)
    return raw, str(path), Path(path).parent


def check_keys(where: str, raw: dict[str, Any], known: set[str], required: tuple[str, ...]) -> None:
    """No key outside ``known``; every key of ``required`` present, a string; and
    ``raw["name"]`` a name (letters, digits and ``_.-``, starting with a letter or
    digit, at most 63: jobs and services name Ray actors and URLs alike)."""
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InputError(where, 0, unknown[0], f"unknown key (known: {', '.join(sorted(known))})")
    for key in required:
        if key not in raw:
            raise InputError(where, 0, key, "missing (required)")
        if not isinstance(raw[key], str):
            raise InputError(where, 0, key, f"must be a string, got {raw[key]!r}")
    name = raw["name"]
    if not valid_name(name):
        raise InputError(
            where,
            0,
            "name",
            f"{name!r}: use letters, digits and _.-, starting with a letter or digit (<= 63)",
        )


def int_key(where: str, raw: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    """``raw[key]`` (or ``default``): an integer in [lo, hi]."""
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(where, 0, key, f"must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise InputError(where, 0, key, f"must be in [{lo}, {hi}], got {value}")
    return value


def resolve_callable(where: str, base: Path, key: str, ref: str, noun: str) -> str:
    """A reference to user code, "file.py:function" (made absolute against ``base``;
    the file must exist) or "package.module:function".

    Args:
        noun: What the function is called in messages ("function", "factory").
    """
    target, sep, func = ref.rpartition(":")
    if not sep or not target or not func.isidentifier():
        raise InputError(where, 0, key, f"{ref!r}: use 'file.py:{noun}' or 'module:{noun}'")
    if target.endswith(".py"):
        file = (base / target).resolve()
        if not file.is_file():
            raise InputError(where, 0, key, f"{file} does not exist")
        return f"{file}:{func}"
    if not all(part.isidentifier() for part in target.split(".")):
        raise InputError(where, 0, key, f"{ref!r}: {target!r} is neither a .py file nor a module")
    return ref
