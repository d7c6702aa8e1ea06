"""A services file: one TOML file, a ``[[service]]`` table per service.

The one format in which the simulator, the Python API and the runtime's ``deepboot
serve`` read services, and in which the workload loaders write them::

    # Services of genai-day.csv (Alibaba GenAI 2026, CC-BY-4.0: ...)
    [[service]]
    name = "M0002"           # a workload's rows name it: application = "infer-M0002"
    model = "M0002"          # a label (the simulator reads no catalog entry for it)
    cold_start_s = 22.7
    concurrency = 1          # tasks a replica serves at once
    slo_wait_s = 45.0        # the request SLO (docs/slo.md): 45 s for 95% of requests
    slo_target = 0.95
    # max_replicas, queue_bound, request_timeout_s, load_timeout_s, handler_timeout_s,
    # max_body_bytes: the runtime's keys (ServiceSpec); handler: the runtime's
    # factory, optional and unused by the simulator

Keys are :class:`~deepboot.core.service.ServiceSpec`'s fields, checked as it checks
them. Every error is an :class:`~deepboot.core.errors.InputError` naming the file,
the line of the service's ``[[service]]`` header and the key.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from deepboot.core.errors import ConfigError, InputError
from deepboot.core.service import FIELDS, ServiceSpec

_HEADER = re.compile(
    r"""^[ \t]*\[\[[ \t]*(?:service|"service"|'service')[ \t]*\]\][ \t]*(?:#.*)?\r?$"""
)
_FIELD_IN_MESSAGE = re.compile(r"field '(\w+)'")
_ESCAPES = {"\\": "\\\\", '"': '\\"'}


def printable(key: str, limit: int = 80) -> str:
    """``key`` fit for a one-line message: characters that are not printable (line
    breaks, escape sequences) written as ``\\uXXXX``, and at most ``limit`` of them."""
    shown = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in key)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _escape(c: str) -> str:
    """A TOML basic string's form of one character (control characters as \\uXXXX)."""
    return f"\\u{ord(c):04X}" if ord(c) < 32 or ord(c) == 0x7F else c


def is_services_document(raw: Mapping[str, Any]) -> bool:
    """True when a parsed TOML document is a services file (a ``[[service]]`` array)
    rather than one service's keys at the top level (the runtime's single-service file)."""
    return "service" in raw and isinstance(raw["service"], list)


def parse_services(raw: Mapping[str, Any], where: str, text: str = "") -> tuple[ServiceSpec, ...]:
    """The services of a parsed services file, in file order.

    Args:
        raw: The TOML document.
        where: The file's name, for errors.
        text: The file's text, to name the line of each ``[[service]]`` header in
            errors (0 without it).

    Raises:
        InputError: no ``[[service]]`` table, another top-level key, an unknown or
            missing key, a bad value, or two services of one name.
    """
    extra = sorted(set(raw) - {"service"})
    if extra:
        raise InputError(
            where, 0, printable(extra[0]), "unknown top-level key (only [[service]] tables)"
        )
    tables = raw.get("service")
    if not isinstance(tables, list) or not tables:
        raise InputError(where, 0, "service", "no [[service]] table")
    lines = header_lines(text)
    specs: list[ServiceSpec] = []
    seen: dict[str, int] = {}
    for i, table in enumerate(tables):
        line = lines[i] if i < len(lines) else 0
        spec = _one(table, where, line)
        if spec.name in seen:
            raise InputError(
                where,
                line,
                "name",
                f"{spec.name!r} is already the name of service {seen[spec.name]}",
            )
        seen[spec.name] = i + 1
        specs.append(spec)
    return tuple(specs)


def _one(table: Any, where: str, line: int) -> ServiceSpec:
    if not isinstance(table, dict):
        raise InputError(where, line, "service", "must be a table")
    unknown = sorted(set(table) - set(FIELDS))
    if unknown:
        raise InputError(
            where, line, printable(unknown[0]), f"unknown key (known: {', '.join(FIELDS)})"
        )
    for key in ("name", "model"):
        if key not in table:
            raise InputError(where, line, key, "missing (required)")
    for key, value in table.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(where, line, key, f"must be finite, got {value!r}")
    try:
        return ServiceSpec(**table)
    except (ConfigError, TypeError) as exc:
        m = _FIELD_IN_MESSAGE.search(str(exc))
        raise InputError(where, line, m.group(1) if m else "", str(exc)) from None


def header_lines(text: str) -> tuple[int, ...]:
    """The 1-based line of each ``[[service]]`` header of a services file's text, in
    file order (the line errors about that service name).

    Lines are counted at ``\\n`` only, as TOML does (not at the other breaks
    ``str.splitlines`` knows). A line that looks like a header is one only where the
    text before it is a whole TOML document holding one service fewer: so a
    ``[[service]]`` inside a multi-line string is not, and a quoted one
    (``[["service"]]``) is. Meant for valid documents. Linear without a multi-line
    string in the text (a line can then only look like a header by being one);
    otherwise each candidate is confirmed by parsing the text before it.
    """
    lines = text.split("\n")
    looks = [i for i, line in enumerate(lines) if _HEADER.match(line)]
    if '"""' not in text and "'''" not in text:
        # No multi-line string: a line can only look like a header by being one.
        return tuple(i + 1 for i in looks)
    found: list[int] = []
    for i in looks:
        try:
            before = tomllib.loads("\n".join(lines[:i]))
        except tomllib.TOMLDecodeError:
            continue  # inside a multi-line string (or a broken document)
        services = before.get("service")
        if (len(services) if isinstance(services, list) else 0) == len(found):
            found.append(i + 1)
    return tuple(found)


def load_services(path: str | Path) -> tuple[ServiceSpec, ...]:
    """Read a services file.

    Raises:
        InputError: unreadable file, bad TOML (with its line), or a bad service
            (:func:`parse_services`).
    """
    raw, text = read_document(path)
    return parse_services(raw, str(path), text)


def read_document(path: str | Path) -> tuple[dict[str, Any], str]:
    """A services file's TOML document and its text, read once (so that a pipe such
    as ``--services <(...)`` works), for callers that check more than
    :func:`parse_services` does (the runtime's handlers, the header lines).

    Raises:
        InputError: unreadable file or bad TOML (with its line).
    """
    return read_toml(path, "services")


def read_toml(path: str | Path, what: str) -> tuple[dict[str, Any], str]:
    """A TOML file's document and its text, read once (UTF-8).

    Args:
        path: The file.
        what: What it is, for the message of an unreadable file ("job", "services").

    Raises:
        InputError: unreadable file, not UTF-8, or bad TOML (with its line).
    """
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InputError(where, 0, "", f"cannot read the {what} file: {reason}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = int(m.group(1)) if (m := re.search(r"line (\d+)", str(exc))) else 0
        raise InputError(where, line, "", f"not valid TOML: {exc}") from None
    return raw, text


def dump_services(specs: Iterable[ServiceSpec], header: Iterable[str] = ()) -> str:
    """A services file's text: ``header`` as comment lines, then one table per spec
    with the keys that differ from their defaults (``name`` and ``model`` always).
    :func:`load_services` reads back equal specs."""
    default = {k: v for k, v in ServiceSpec("x", "x").to_json().items() if k not in ("name",)}
    out = [f"# {line}".rstrip() for line in header]
    for spec in specs:
        out += ["", "[[service]]"]
        args: dict[str, Any] = {}
        for key, value in spec.to_json().items():
            if key == "args":
                args = value
            elif value is not None and (key in ("name", "model") or value != default[key]):
                out.append(f"{key} = {_toml_value(value)}")
        if args:
            out.append("[service.args]")
            out += [f"{k} = {_toml_value(v)}" for k, v in args.items()]
    return "\n".join(out).lstrip("\n") + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(_ESCAPES.get(c) or _escape(c) for c in value) + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (env, sleep, wake)
        pairs = ", ".join(f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + pairs + " }" if pairs else "{}"
    raise ConfigError(f"{value!r}: not a TOML value deepboot writes")
