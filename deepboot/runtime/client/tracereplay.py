"""The trace behind ``deepboot load --trace``: a DeepBoot-format workload's inference
rows as a schedule of requests (:class:`~deepboot.runtime.client.loadrecords.PlannedRequest`).

The workload is read by the simulator's own reader
(:func:`deepboot.sim.workload.load_workload`, called by ``deepboot load``:
:func:`deepboot.cli.load.read_trace`; the runtime layer does not import the
simulator), so a trace is valid here exactly when it is valid there, and every bad
row is an :class:`~deepboot.core.errors.InputError` naming the file, the line and the
column. Its training rows are checked and ignored. Without a services file, an
inference row is ``infer-<model>-<k>`` of a catalog model and its service is the whole
application (``infer-bert-1``); with one (the file a trace generator wrote beside the
workload, or the one ``deepboot serve`` reads), the row is ``infer-<name>`` of one of
its services and the service is ``<name>``.

Each inference row becomes one request (:func:`trace_schedule`): sent at its ``time``,
to its service (or the one ``--service-map`` maps it to), asking for its ``duration``
as execution time, times and durations both divided by the time scale.

Compression is not neutral: a replica's cold start takes as long at any time scale,
while the trace's gaps and execution times shrink, so cold starts weigh more against
them and SLO attainment under compression is pessimistic (see :data:`COMPRESSION_NOTE`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from deepboot.core.errors import ConfigError, InputError
from deepboot.core.jobs import InferenceTaskSpec, Workload
from deepboot.core.service import DEFAULT_SLO_WAIT_S, ServiceSpec, valid_name
from deepboot.runtime.client.loadrecords import PlannedRequest
from deepboot.runtime.client.rateprofile import MAX_REQUESTS

MAX_TIME_SCALE = 1e6
"""Largest ``--time-scale`` (a trace day in under a tenth of a second)."""

COMPRESSION_NOTE = (
    "Compressing time changes the ratio of cold start to run time: a 20 s cold start "
    "takes 20 s at any --time-scale, while the trace's gaps and execution times shrink "
    "by it, so SLO attainment under compression is pessimistic."
)
"""What ``--help`` and the summary say about ``--time-scale``."""


ANY_SERVICE = "*"
"""A service map's key for every service the map does not name (``--service-map
'*=echo'``: the whole trace to one service)."""


def mapped(service_map: Mapping[str, str], service: str) -> str:
    """Where ``service``'s rows go: its entry, else the :data:`ANY_SERVICE` entry, else
    itself."""
    return service_map.get(service, service_map.get(ANY_SERVICE, service))


def parse_service_map(pairs: Sequence[str]) -> dict[str, str]:
    """``--service-map OLD=NEW`` values as ``{OLD: NEW}`` (OLD may be
    :data:`ANY_SERVICE`).

    Raises:
        ConfigError: a value without ``=``, an empty side, a NEW that is not a valid
            service name, or an OLD given twice.
    """
    mapping: dict[str, str] = {}
    for pair in pairs:
        old, sep, new = (part.strip() for part in pair.partition("="))
        if not sep or not old or not new:
            raise ConfigError(f"--service-map {pair!r}: expected OLD=NEW (two service names)")
        if not valid_name(new):
            raise ConfigError(
                f"--service-map {pair!r}: {new!r} is not a service name (letters, digits "
                "and _.-, starting with a letter or digit, at most 63)"
            )
        if old in mapping:
            raise ConfigError(f"--service-map maps {old!r} twice ({mapping[old]!r}, {new!r})")
        mapping[old] = new
    return mapping


def trace_schedule(
    workload: Workload,
    source: str,
    time_scale: float = 1.0,
    service_map: Mapping[str, str] | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
    limit: int | None = None,
) -> list[PlannedRequest]:
    """The requests of ``workload``'s inference tasks, in submit order.

    The tasks submitted in ``[start_s, start_s + duration_s)`` (trace seconds; no
    end without ``duration_s``), the first ``limit`` of them, become one request
    each: due at ``(submit_time - start_s) / time_scale``, to
    ``mapped(service_map, service)``, with ``exec_s = duration / time_scale``.

    Args:
        workload: The trace (:func:`deepboot.cli.load.read_trace`).
        source: Its file, for messages.
        time_scale: Trace seconds per replayed second, in ``(0, MAX_TIME_SCALE]``.
        service_map: Trace service -> the service to send to.
        start_s, duration_s, limit: The slice to replay (see above).

    Raises:
        ConfigError: a bad ``time_scale``, ``start_s``, ``duration_s`` or ``limit``;
            a ``service_map`` key that names no service of the trace; a window with no
            request; more than :data:`~deepboot.runtime.client.rateprofile.MAX_REQUESTS`.
        InputError: a trace service whose name the runtime refuses (after mapping).
    """
    _check_window(time_scale, start_s, duration_s, limit)
    mapping = dict(service_map or {})
    _check_map_keys(mapping, {t.service for t in workload.inference}, source)
    end = math.inf if duration_s is None else start_s + duration_s
    out: list[PlannedRequest] = []
    for task in workload.inference:  # sorted by submit time (load_workload)
        if not start_s <= task.submit_time < end:
            continue
        if limit is not None and len(out) >= limit:
            break
        if len(out) >= MAX_REQUESTS:
            raise ConfigError(
                f"{source} has more than {MAX_REQUESTS:,} requests to replay; at most "
                f"{MAX_REQUESTS:,} per run (give --limit, or --start and --duration)"
            )
        out.append(
            PlannedRequest(
                due_s=(task.submit_time - start_s) / time_scale,
                service=_sent_to(mapping, task, source),
                exec_s=task.duration / time_scale,
            )
        )
    if not out:
        window = f"[{start_s:g}, {end:g})" if duration_s is not None else f"from {start_s:g} s"
        raise ConfigError(f"no inference row of {source} falls in the window {window}")
    return out


def _check_window(
    time_scale: float, start_s: float, duration_s: float | None, limit: int | None
) -> None:
    """Raise ConfigError for a bad ``--time-scale``, ``--start``, ``--duration`` or
    ``--limit`` (see :func:`trace_schedule`)."""
    if not (math.isfinite(time_scale) and 0 < time_scale <= MAX_TIME_SCALE):
        raise ConfigError(f"--time-scale must be in (0, {MAX_TIME_SCALE:g}], got {time_scale}")
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ConfigError(f"--start must be a number of trace seconds >= 0, got {start_s}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ConfigError(f"--duration must be a number of trace seconds > 0, got {duration_s}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {limit}")


def _check_map_keys(mapping: Mapping[str, str], services: set[str], source: str) -> None:
    """Raise ConfigError when ``mapping`` has a key that is neither one of the trace's
    ``services`` nor :data:`ANY_SERVICE`."""
    unknown = sorted(set(mapping) - services - {ANY_SERVICE})
    if unknown:
        shown = ", ".join(sorted(services)[:10])
        raise ConfigError(
            f"--service-map names {', '.join(map(repr, unknown))}, not a service of "
            f"{source} (its services: {shown}{' ...' if len(services) > 10 else ''})"
        )


def _sent_to(mapping: Mapping[str, str], task: InferenceTaskSpec, source: str) -> str:
    """The service ``task``'s request goes to (after ``mapping``).

    Raises:
        InputError: a name the runtime refuses.
    """
    service = mapped(mapping, task.service)
    if not valid_name(service):
        # The reader's names always pass; this guards the runtime's URL and ids.
        raise InputError(
            source,
            0,
            "application",
            f"task {task.name!r}: service {service!r} is not a name the runtime "
            "accepts (map it with --service-map OLD=NEW)",
        )
    return service


def slo_waits(
    workload: Workload,
    service_map: Mapping[str, str] | None = None,
    services: Mapping[str, ServiceSpec] | None = None,
    slo_wait_s: float | None = None,
) -> dict[str, float]:
    """Each replayed service's ``slo_wait_s``: ``slo_wait_s`` for all when given; else
    ``services``' (the services file's specs, by name) for its services; else
    :data:`~deepboot.core.service.DEFAULT_SLO_WAIT_S`. Keys are the services sent to
    (after ``service_map``).

    Raises:
        ConfigError: ``service_map`` merges services whose SLOs differ (give
            ``--slo-wait``).
    """
    mapping = service_map or {}
    out: dict[str, float] = {}
    origin: dict[str, str] = {}
    for name in dict.fromkeys(t.service for t in workload.inference):
        target = mapped(mapping, name)
        if slo_wait_s is not None:
            wait = slo_wait_s
        elif services is not None and name in services:
            wait = services[name].slo_wait_s
        else:
            wait = DEFAULT_SLO_WAIT_S
        if target in out and out[target] != wait:
            raise ConfigError(
                f"--service-map sends {origin[target]!r} (slo_wait_s {out[target]:g}) and "
                f"{name!r} (slo_wait_s {wait:g}) to {target!r}; give --slo-wait S for all"
            )
        out[target] = wait
        origin.setdefault(target, name)
    return out
