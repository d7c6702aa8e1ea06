"""An inference service's file (TOML), read into a :class:`~deepboot.core.service.ServiceSpec`.

Example (examples/runtime/echo.toml)::

    name = "echo"
    model = "tiny-mlp"
    handler = "echo_service.py:load"   # file (relative to this file) : factory
    concurrency = 1                     # requests in flight per replica
    max_replicas = 4                    # 0 = no cap
    queue_bound = 64                    # requests waiting for a replica (then 503)
    request_timeout_s = 30              # seconds a request may wait (then 503)
    # handler_timeout_s = 30            # seconds one call may run (then 504, replica restarted);
    #                                   # default: request_timeout_s
    # load_timeout_s = 120              # seconds a replica may take to load (then killed);
    #                                   # default: 3x the measured cold start, 300 s before one
    # max_body_bytes = 1048576          # largest request body (then 413)
    # cold_start_s = 2.0                # measured on the first start when absent
    # slo_wait_s = 1.0, slo_target = 0.99, guaranteed_replicas = 0: the request SLO
    #                                   # (kept; only the simulator acts on it for now)

    [args]                              # passed to the factory as keyword arguments
    hidden = 64

A *command service* gives ``command`` instead of ``handler``: deepboot runs the
server (vLLM, TGI, Triton, the stand-in ``examples/runtime/standin_server.py``) and
proxies ``/v1/<service>/<rest>`` to it (examples/runtime/standin.toml)::

    name = "chat"
    model = "llama-8b"
    command = ["python", "standin_server.py", "--port", "{port}"]   # {port} {gpus} {model}
    ready_path = "/health"              # polled until 200 before it takes requests
    sleep = { method = "POST", path = "/sleep?level=1", timeout_s = 30 }
    wake = { method = "POST", path = "/wake_up", timeout_s = 60 }
    gpus_per_replica = 1

Every error names the file and the key (``InputError``; TOML syntax errors carry
the line).

``deepboot serve`` also reads a services file (:mod:`deepboot.core.servicefile`: one
``[[service]]`` table per service, the file the simulator's ``--services`` reads):
:func:`load_service_file` takes either. There every service needs a ``handler``
(relative files resolved against the file's directory), and errors name the line of
the service's ``[[service]]`` header.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from deepboot.core.errors import ConfigError, InputError
from deepboot.core.service import (
    DEFAULT_BODY_BYTES,
    DEFAULT_SLO_TARGET,
    DEFAULT_SLO_WAIT_S,
    FIELDS,
    MAX_BODY_BYTES,
    MAX_CONCURRENCY,
    MAX_QUEUE_BOUND,
    MAX_REPLICAS,
    MAX_REQUEST_TIMEOUT_S,
    ServiceSpec,
)
from deepboot.core.servicefile import (
    header_lines,
    is_services_document,
    parse_services,
    read_document,
)
from deepboot.runtime.client.specfile import check_keys, int_key, read_toml, resolve_callable

_KNOWN = set(FIELDS)


def _seconds(
    path: str, raw: dict[str, Any], key: str, default: float, unit: str = " of seconds"
) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(path, 0, key, f"must be a finite number{unit}, got {value!r}")
    return float(value)


def load_service(path: str | Path) -> ServiceSpec:
    """Read and validate a service file.

    Raises:
        InputError: unreadable file, bad TOML (with its line), unknown or missing
            key, a bad handler or a value out of range; the message names the file and
            the key.
    """
    raw, where, base = read_toml(path, "service")
    return parse_service(raw, where, base, name_paths=True)


def load_service_file(path: str | Path) -> tuple[ServiceSpec, ...]:
    """Read a service file (one service's keys at the top level) or a services file
    (``[[service]]`` tables), read once.

    Raises:
        InputError: as :func:`load_service` for a service file; for a services file,
            a bad table as :func:`~deepboot.core.servicefile.parse_services` says, or
            a missing or bad ``handler`` (naming the file, the line of the service's
            ``[[service]]`` header and the key).
    """
    raw, text = read_document(path)
    where, base = str(path), Path(path).parent
    if not is_services_document(raw):
        return (parse_service(raw, where, base, name_paths=True),)
    parse_services(raw, where, text)  # the file's own checks, each naming its line
    lines = header_lines(text)
    specs = []
    for i, table in enumerate(raw["service"]):
        line = lines[i] if i < len(lines) else 0
        if "handler" not in table and "command" not in table:
            raise InputError(
                where, line, "handler", "missing (deepboot serve needs a handler or a command)"
            )
        try:
            specs.append(parse_service(table, where, base, name_paths=True))
        except InputError as exc:
            raise InputError(where, line, exc.field, exc.message) from None
    return tuple(specs)


def parse_service(
    raw: dict[str, Any], where: str, base: Path, *, name_paths: bool = False
) -> ServiceSpec:
    """Validate a service's keys (a service file's table, or a JSON body).

    Args:
        raw: The keys, as in a service file.
        where: What to name in errors (the file, or the endpoint).
        base: Directory a relative ``handler`` file is resolved against.
        name_paths: Whether an error may name the handler file looked for (a file on
            the command line); never for a spec that came over HTTP (the default).

    Raises:
        InputError: unknown or missing key, a bad handler (a file that does not exist
            or cannot be read, a NUL byte, a path too long), or a value out of range
            (names ``where`` and the key).
    """
    # A spec's JSON (ServiceSpec.to_json) gives every key: an empty command and
    # workdir are a handler service's.
    raw = {k: v for k, v in raw.items() if not (k in ("command", "workdir") and v in ("", []))}
    has_handler, has_command = "handler" in raw and raw["handler"] != "", "command" in raw
    if has_handler and has_command:
        raise InputError(where, 0, "command", "give either handler or command, not both")
    if has_command:
        raw.pop("handler", None)
    if "workdir" in raw:
        raise InputError(where, 0, "workdir", "set by deepboot (the service file's directory)")
    check_keys(
        where, raw, _KNOWN, ("name", "model") if has_command else ("name", "model", "handler")
    )
    name = raw["name"]
    if not raw["model"]:
        raise InputError(where, 0, "model", "must not be empty")
    handler = ""
    if not has_command:
        handler = resolve_callable(
            where, base, "handler", raw["handler"], "factory", name_paths=name_paths
        )
        if raw.get("gpus_per_replica", 1) != 1:
            raise InputError(
                where, 0, "gpus_per_replica",
                "a handler service's replica has one GPU: several need a command service "
                "(a server of your own, e.g. vLLM with --tensor-parallel-size)",
            )  # fmt: skip
    elif not isinstance(raw["command"], list) or not raw["command"]:
        raise InputError(
            where, 0, "command",
            'must be a non-empty list, e.g. ["python", "server.py", "--port", "{port}"]',
        )  # fmt: skip
    command_keys = {
        k: raw[k]
        for k in (
            "env", "ready_path", "health_path", "sleep", "wake", "sleep_gpu_gb",
            "stop_grace_s", "gpus_per_replica",
        )
        if k in raw
    }  # fmt: skip
    args = raw.get("args", {})
    if not isinstance(args, dict):
        raise InputError(where, 0, "args", "must be a table ([args])")
    cold = _cold_start(where, raw)
    timeouts = _timeouts(where, raw)
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
            request_timeout_s=timeouts["request_timeout_s"] or 60.0,
            load_timeout_s=timeouts["load_timeout_s"],
            handler_timeout_s=timeouts["handler_timeout_s"],
            max_body_bytes=int_key(
                where, raw, "max_body_bytes", DEFAULT_BODY_BYTES, 1, MAX_BODY_BYTES
            ),
            # Kept with the service; the runtime does not act on its SLO yet.
            slo_wait_s=_seconds(where, raw, "slo_wait_s", DEFAULT_SLO_WAIT_S),
            slo_target=_seconds(where, raw, "slo_target", DEFAULT_SLO_TARGET, ""),
            guaranteed_replicas=int_key(where, raw, "guaranteed_replicas", 0, 0, MAX_REPLICAS),
            model_gb=_seconds(where, raw, "model_gb", 0.0, " of GB") if "model_gb" in raw else None,
            command=tuple(raw.get("command", ())),
            workdir=str(base.resolve()) if has_command else "",
            **command_keys,
        )
    except (ConfigError, TypeError) as exc:  # a check above missed it: still name the key
        m = re.search(r"field '(\w+)'", str(exc))
        raise InputError(where, 0, m.group(1) if m else "", str(exc)) from None


def _cold_start(where: str, raw: dict[str, Any]) -> float | None:
    """``cold_start_s``: seconds >= 0, or None when absent (measured on the first start)."""
    if "cold_start_s" not in raw:
        return None
    cold = _seconds(where, raw, "cold_start_s", 0.0)
    if cold < 0:
        raise InputError(where, 0, "cold_start_s", f"must be >= 0 seconds, got {cold:g}")
    return cold


def _timeouts(where: str, raw: dict[str, Any]) -> dict[str, float | None]:
    """The three timeouts by key, each in ``(0, MAX_REQUEST_TIMEOUT_S]`` seconds:
    ``request_timeout_s`` (60 when absent), ``load_timeout_s`` and
    ``handler_timeout_s`` (None when absent: their defaults are the runtime's)."""
    timeouts: dict[str, float | None] = {}
    for key in ("request_timeout_s", "load_timeout_s", "handler_timeout_s"):
        if key not in raw and key != "request_timeout_s":
            timeouts[key] = None
            continue
        timeout = _seconds(where, raw, key, 60.0)
        if not 0 < timeout <= MAX_REQUEST_TIMEOUT_S:
            raise InputError(
                where, 0, key, f"must be in (0, {MAX_REQUEST_TIMEOUT_S:g}] seconds, got {timeout:g}"
            )
        timeouts[key] = timeout
    return timeouts
