"""An inference service's file (TOML), read into a :class:`~deepboot.core.service.ServiceSpec`.

Example (examples/runtime/echo.toml)::

    name = "echo"
    model = "tiny-mlp"
    handler = "echo_service.py:load"   # file (relative to this file) : factory
    concurrency = 1                     # requests in flight per replica
    max_replicas = 4                    # 0 = no cap
    queue_bound = 64                    # requests waiting for a replica (then 503)
    request_timeout_s = 30              # seconds a request may wait (then 503)
    # cold_start_s = 2.0                # measured on the first start when absent

    [args]                              # passed to the factory as keyword arguments
    hidden = 64

Every error names the file and the key (``InputError``; TOML syntax errors carry
the line).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from deepboot.core.errors import ConfigError, InputError
from deepboot.core.service import (
    FIELDS,
    MAX_CONCURRENCY,
    MAX_QUEUE_BOUND,
    MAX_REPLICAS,
    MAX_REQUEST_TIMEOUT_S,
    ServiceSpec,
)
from deepboot.runtime.specfile import check_keys, int_key, read_toml, resolve_callable

_KNOWN = set(FIELDS)


def _seconds(path: str, raw: dict[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(path, 0, key, f"must be a finite number of seconds, got {value!r}")
    return float(value)


def load_service(path: str | Path) -> ServiceSpec:
    """Read and validate a service file.

    Raises:
        InputError: unreadable file, bad TOML (with its line), unknown or missing
            key, a bad handler or a value out of range; the message names the file and
            the key.
    """
    raw, where, base = read_toml(path, "service")
    return parse_service(raw, where, base)


def parse_service(raw: dict[str, Any], where: str, base: Path) -> ServiceSpec:
    """Validate a service's keys (a service file's table, or a JSON body).

    Args:
        raw: The keys, as in a service file.
        where: What to name in errors (the file, or the endpoint).
        base: Directory a relative ``handler`` file is resolved against.

    Raises:
        InputError: unknown or missing key, a bad handler, or a value out of range
            (names ``where`` and the key).
    """
    check_keys(where, raw, _KNOWN, ("name", "model", "handler"))
    name = raw["name"]
    if not raw["model"]:
        raise InputError(where, 0, "model", "must not be empty")
    handler = resolve_callable(where, base, "handler", raw["handler"], "factory")
    args = raw.get("args", {})
    if not isinstance(args, dict):
        raise InputError(where, 0, "args", "must be a table ([args])")
    cold: float | None = None
    if "cold_start_s" in raw:
        cold = _seconds(where, raw, "cold_start_s", 0.0)
        if cold < 0:
            raise InputError(where, 0, "cold_start_s", f"must be >= 0 seconds, got {cold:g}")
    timeout = _seconds(where, raw, "request_timeout_s", 60.0)
    if not 0 < timeout <= MAX_REQUEST_TIMEOUT_S:
        raise InputError(
            where,
            0,
            "request_timeout_s",
            f"must be in (0, {MAX_REQUEST_TIMEOUT_S:g}] seconds, got {timeout:g}",
        )
    try:
        return ServiceSpec(
            name=name,
            model=raw["model"],
            handler=handler,
            args=args,
            concurrency=int_key(where, raw, "concurrency", 1, 1, MAX_CONCURRENCY),
            max_replicas=int_key(where, raw, "max_replicas", 0, 0, MAX_REPLICAS),
            cold_start_s=cold,
            queue_bound=int_key(where, raw, "queue_bound", 64, 1, MAX_QUEUE_BOUND),
            request_timeout_s=timeout,
        )
    except ConfigError as exc:  # a check above missed it: still name the key
        m = re.search(r"field '(\w+)'", str(exc))
        raise InputError(where, 0, m.group(1) if m else "", str(exc)) from None
