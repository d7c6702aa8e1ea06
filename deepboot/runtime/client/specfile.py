"""What job files and service files share: reading TOML, integer keys, and the
"file.py:function" / "package.module:function" references to user code.

Every error is an :class:`~deepboot.core.errors.InputError` naming the file (or the
endpoint a spec came through) and the key; TOML syntax errors carry the line. A spec
that came over HTTP is answered without any path resolved here (a relative reference
is named as given, an absolute one not at all): :func:`resolve_callable`.
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


NAME_MAX = 255
"""Longest file name (bytes) a reference may hold, the usual file systems' limit."""
PATH_MAX = 4095
"""Longest path (bytes) a reference may hold, the usual ``PATH_MAX`` less its NUL."""


def shown(text: str, most: int = 80) -> str:
    """``text`` quoted for a message, its middle cut when longer than ``most``."""
    if len(text) > most:
        text = text[: most // 2] + "..." + text[-(most // 2 - 3) :]
    return repr(text)


def resolve_callable(
    where: str, base: Path, key: str, ref: str, noun: str, *, name_paths: bool = False
) -> str:
    """A reference to user code, "file.py:function" (made absolute against ``base``;
    the file must exist) or "package.module:function".

    Args:
        noun: What the function is called in messages ("function", "factory").
        name_paths: Whether a message may name the file looked for: True for a spec
            file given on the command line (the user's own paths); False (a spec that
            came over HTTP) names only the key, and a relative reference as given,
            never a path resolved here (docs/runtime.md, "Security").

    Raises:
        InputError: naming ``where`` and ``key``: a malformed reference, a NUL byte,
            a name or path too long, or a file that does not exist, is no regular
            file or cannot be looked at (any ``OSError``, a symlink loop).
    """
    target, sep, func = ref.rpartition(":")
    if not sep or not target or not func.isidentifier():
        raise InputError(where, 0, key, f"{shown(ref)}: use 'file.py:{noun}' or 'module:{noun}'")
    if target.endswith(".py"):
        return f"{_resolve_file(where, base, key, target, name_paths)}:{func}"
    if not all(part.isidentifier() for part in target.split(".")):
        raise InputError(
            where, 0, key, f"{shown(ref)}: {shown(target)} is neither a .py file nor a module"
        )
    return ref


def _resolve_file(where: str, base: Path, key: str, target: str, name_paths: bool) -> Path:
    """``target`` (a .py file) made absolute against ``base``; it must be a file."""
    if "\x00" in target:
        raise InputError(where, 0, key, "the file's path must not hold a NUL byte")
    raw = target.encode("utf-8", "surrogatepass")
    if len(raw) > PATH_MAX or any(len(name) > NAME_MAX for name in raw.split(b"/")):
        raise InputError(
            where,
            0,
            key,
            f"the file's path is too long (at most {PATH_MAX} bytes, {NAME_MAX} for each name)",
        )
    file = base / target
    try:
        file = file.resolve()
        if file.is_file():
            return file
        problem = "is not a file" if file.exists() else "does not exist"
    except OSError as exc:  # too long once joined to base, EACCES, ELOOP, ...
        problem = f"cannot be read ({exc.strerror or type(exc).__name__})"
    except RuntimeError:  # Python 3.11's resolve, for a symlink loop
        problem = "cannot be read (a symlink loop)"
    except ValueError:  # a lone surrogate (JSON allows one): no file is named so
        problem = "cannot be read (not a valid file name)"
    if name_paths:  # the user's own file, on the command line
        raise InputError(where, 0, key, f"{file} {problem}")
    # Over HTTP: never where the controller looked, and the same words whatever it found.
    if Path(target).is_absolute():
        raise InputError(
            where, 0, key, "the file does not exist or cannot be read (the path is not repeated)"
        )
    raise InputError(
        where,
        0,
        key,
        f"file {shown(target)} (relative to the controller's directory) does not exist or "
        "cannot be read: send an absolute path",
    )
