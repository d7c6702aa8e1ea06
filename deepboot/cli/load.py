"""``deepboot load SERVICE --rate-profile FILE`` and ``deepboot load --trace FILE``:
drive the runtime's HTTP endpoint with a rate profile (one service) or replay a
workload's inference rows (each to its service, with its execution time), and record
every request (see :mod:`deepboot.runtime.client.loadgen` and
:mod:`deepboot.runtime.client.tracereplay`)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from deepboot.cli import limits
from deepboot.cli.files import PathArg, check_outputs, require_path, write_text
from deepboot.cli.services import read_services_arg
from deepboot.core.errors import ConfigError, InputError
from deepboot.core.service import DEFAULT_SLO_WAIT_S, MAX_REQUEST_TIMEOUT_S
from deepboot.runtime.store.statedir import STATE_DIR_HELP

if TYPE_CHECKING:
    from deepboot.core.jobs import Workload
    from deepboot.runtime.client.loadgen import LoadSummary, PlannedRequest
    from deepboot.runtime.client.provenhttp import Target
    from deepboot.runtime.store.storerows import ServiceRow
    from deepboot.sim.services import ServicesFile

MAX_TIMEOUT_S = 3600.0
"""``0 < --timeout <= MAX_TIMEOUT_S``."""
MAX_CONNECTIONS = 65_535
"""``1 <= --max-connections <= MAX_CONNECTIONS``."""
MIN_DEFAULT_TIMEOUT_S = 30.0
"""The default ``--timeout``'s floor (and the default without a registered service)."""
TIMEOUT_MARGIN_S = 5.0
"""What the default ``--timeout`` adds to the longest the router may keep a request."""

_SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")

_LOAD_EPILOG = """\
example rate profile (lull, spike, lull), examples/runtime/lull-spike-lull.csv:
  time_s,rps
  0,2
  30,50
  45,2
  75,0

Each row's rate (requests/s) holds until the next row's time; the last row marks
the end (its rps must be 0), so this one runs 75 s: 2 rps for 30 s, a spike of
50 rps for 15 s, 2 rps for 30 s (870 requests). Requests are evenly spaced (or a
Poisson process with --poisson) and sent on time whatever the answers; nothing is
retried (a 503 is recorded, not hidden).

examples:
  deepboot load infer-bert-0 --rate-profile examples/runtime/lull-spike-lull.csv
  deepboot load infer-bert-0 --rate-profile p.csv --poisson --seed 3 --out run3.csv
  deepboot load svc --rate-profile p.csv --url http://10.0.0.1:8080 --token-file tok

Trace replay (--trace FILE, instead of SERVICE --rate-profile): a DeepBoot-format
workload (name,time,application,num_replicas,batch_size,duration,num_task, the
format 'deepboot simulate' reads, checked the same way); each inference row is one
request, sent at its time to its service (infer-<model>-<k>: the service of that
name; with --services FILE, infer-<name>: that service of the file), with its
duration as execution time: the body is --body (a JSON object) plus "exec_s": the
duration, which the example handler (examples/runtime/echo_service.py) spends.
--time-scale K divides times and durations by K (60: a trace minute per second);
--service-map OLD=NEW sends a service's rows to another ('*=NEW': every other
service's); --start, --duration (trace seconds) and --limit replay a slice.
Training rows are checked and ignored.

  deepboot load --trace ../shared/traces/workloads/small.csv --time-scale 60 \\
      --service-map '*=echo' --limit 200
  deepboot load --trace genai.csv --services genai.toml --time-scale 10

Compressing time changes the ratio of cold start to run time: a 20 s cold start is
20 s at any --time-scale, while the trace's gaps and execution times shrink by it,
so SLO attainment under compression is pessimistic.

The requests CSV has one row per request:
id,send_s,answer_s,status,latency_s,error,service,wait_s,exec_s (seconds since the
start; status 0: no HTTP answer, see error: timeout, a connection error; a redirect
is recorded, not followed; wait_s: the router's X-Wait-Ms header, in seconds, empty
without one; exec_s: the execution time asked for, empty without --trace).

SLO attainment, per service: the share of its requests whose wait (arrival at the
router to hand-off to a ready replica) is at most its slo_wait_s (--slo-wait, else
the services file's, else 1 s). The wait is the X-Wait-Ms header; a 200 without it
is estimated as latency minus exec_s (network and router time included, so
pessimistic; the summary counts them); an answer without a wait (a 503, a timeout)
missed.

The endpoint and its token: without --url, the endpoint STATE_DIR/http.json
records, and the bearer token of STATE_DIR/http-token (or --token-file). The token
only ever travels on a TCP connection that has first proved, on that same connection
and without the token, that the process at the other end holds it: GET
/healthz?challenge=C must echo http.json's instance id and answer the fresh random C
with HMAC(token, C). Every new connection is proved so, at the address http.json
records when it opens (a restarted controller is followed), so a process that takes
the port of a controller that died never receives the token. Every answer counted is
therefore the answer of a process that holds the token. When a new connection fails
the proof (another instance id, a wrong or missing proof, not HTTP), load stops at
once: it cancels what is in flight, saves the requests CSV, prints one error line and
exits 2 (before the first request, nothing is written). A refused or reset connection
is no proof either way: its request is recorded (status 0) and the run goes on.
With --url URL --token-file F each connection proves itself with the same challenge
(the instance id is not checked: none is known). With --url and no --token-file no
proof is possible and no token is sent: the requests go to that URL unproven (the
controller answers them 401)."""


def add_parser(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``deepboot load`` to the ``deepboot`` parser."""
    p: argparse.ArgumentParser = sub.add_parser(
        "load",
        help="send requests to inference services following a rate profile or a trace",
        description="Send POST /v1/SERVICE/infer requests to the runtime's HTTP endpoint "
        "at the rates of a profile (SERVICE --rate-profile FILE) or at the times of a "
        "workload's inference rows (--trace FILE), record each answer in a CSV and print "
        "a summary (answers by status, latency percentiles of the 200s, SLO attainment "
        "per service).",
        epilog=_LOAD_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument(
        "service",
        metavar="SERVICE",
        nargs="?",
        help="the inference service's name (with --rate-profile)",
    )
    p.add_argument(
        "--rate-profile",
        metavar="FILE",
        help="CSV time_s,rps (see below); one of --rate-profile and --trace",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="DeepBoot workload CSV whose inference rows to replay (see below)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        metavar="K",
        help="with --trace: trace seconds per second, dividing its times and execution "
        "times (1 without it; 60: a trace minute per second). Compressing time changes the "
        "ratio of cold start to run time (a 20 s cold start is 20 s at any K while the "
        "trace's gaps shrink), so attainment under compression is pessimistic",
    )
    p.add_argument(
        "--service-map",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="with --trace: send the rows of service OLD to service NEW (repeatable; "
        "OLD '*': every service not named otherwise)",
    )
    p.add_argument(
        "--services",
        metavar="FILE",
        help="with --trace: the workload's services file (rows infer-<name> name its "
        "services; their slo_wait_s apply)",
    )
    p.add_argument(
        "--start",
        type=float,
        default=None,
        metavar="S",
        help="with --trace: replay the rows from trace second S on (sent from 0; 0 without it)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="with --trace: replay only the rows before trace second START + S",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="with --trace: replay at most the first N rows (of the window)",
    )
    p.add_argument(
        "--slo-wait",
        type=float,
        default=None,
        metavar="S",
        help="every service's slo_wait_s for the attainment, 0 < S <= "
        f"{MAX_REQUEST_TIMEOUT_S:g}; without it, the --services file's, else each "
        "service's as registered with the cluster ('deepboot serve'), else "
        f"{DEFAULT_SLO_WAIT_S:g}",
    )
    p.add_argument(
        "--out",
        default="requests.csv",
        metavar="FILE",
        help="the requests CSV (written atomically; not an input file). An existing "
        "file is kept: the CSV goes to the first free FILE-1.csv, FILE-2.csv, ... "
        "(printed), unless --force",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    p.add_argument("--body", default="{}", metavar="JSON", help="JSON body of every request")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help=f"client-side limit of one request in seconds, 0 < S <= {MAX_TIMEOUT_S:g}; "
        "past it the request is recorded as status 0, timed out. Default: longer than "
        "the router may keep it (each registered service's cold start, measured or "
        "declared, plus its request_timeout_s and handler_timeout_s, plus "
        f"{TIMEOUT_MARGIN_S:g} s; at least {MIN_DEFAULT_TIMEOUT_S:g} s), so that the "
        "router's own answer, a 504, comes back rather than a client time-out",
    )
    p.add_argument(
        "--poisson",
        action="store_true",
        help="Poisson arrivals of the profile's rate instead of evenly spaced ones",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help=f"seed of the --poisson arrivals, {limits.SEED_HELP}; 0 when not given",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=1000,
        metavar="N",
        help=f"most connections open at once, 1 <= N <= {MAX_CONNECTIONS} (each proves "
        "the endpoint holds the token before it carries the token)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help=STATE_DIR_HELP,
    )
    p.add_argument(
        "--url",
        metavar="URL",
        help="the endpoint's base URL, http://HOST:PORT; with --token-file each connection "
        "proves it holds that token before the token goes on it (no instance id is "
        "checked), without it nothing is proved and no token is sent; without --url, "
        "STATE_DIR/http.json's, each connection proving it is that controller",
    )
    p.add_argument(
        "--token-file",
        metavar="F",
        help="file holding the bearer token; without it, STATE_DIR/http-token (none with --url)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_load)


_TRACE_ONLY = ("time_scale", "services", "start", "duration", "limit")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_args(args: argparse.Namespace) -> None:
    """Refuse a bad combination or value of flags (ConfigError), before any file is read."""
    if args.trace is not None and args.rate_profile is not None:
        raise ConfigError(
            "--trace and --rate-profile are two ways to schedule the requests; give one"
        )
    if args.trace is None and args.rate_profile is None:
        raise ConfigError("give SERVICE --rate-profile FILE, or --trace FILE")
    if args.slo_wait is not None and not (
        math.isfinite(args.slo_wait) and 0 < args.slo_wait <= MAX_REQUEST_TIMEOUT_S
    ):
        raise ConfigError(
            f"--slo-wait must be a number of seconds in (0, {MAX_REQUEST_TIMEOUT_S:g}], "
            f"got {args.slo_wait}"
        )
    if args.trace is not None:
        if args.service is not None:
            raise ConfigError(
                f"SERVICE {args.service!r} is not used with --trace: its rows name their "
                "services (send them elsewhere with --service-map OLD=NEW)"
            )
        if args.poisson or args.seed is not None:
            raise ConfigError(
                "--poisson and --seed shape a --rate-profile; --trace sends at its times"
            )
    else:
        if args.service is None:
            raise ConfigError("--rate-profile needs SERVICE, the service to send to")
        given = [_flag(d) for d in _TRACE_ONLY if getattr(args, d) is not None]
        given += ["--service-map"] if args.service_map else []
        if given:
            raise ConfigError(f"{', '.join(given)}: only with --trace, not --rate-profile")
    if args.service is not None and not _SERVICE.fullmatch(args.service):
        raise ConfigError(
            f"service name {args.service!r}: use letters, digits and _.- (at most 63)"
        )
    if args.timeout is not None and not (
        math.isfinite(args.timeout) and 0 < args.timeout <= MAX_TIMEOUT_S
    ):
        raise ConfigError(
            f"--timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {args.timeout}"
        )
    if not 1 <= args.max_connections <= MAX_CONNECTIONS:
        raise ConfigError(
            f"--max-connections must be in [1, {MAX_CONNECTIONS}], got {args.max_connections}"
        )
    if args.seed is not None:
        if not args.poisson:
            raise ConfigError("--seed is the seed of --poisson arrivals; add --poisson")
        limits.check_seed(args.seed)


def _body(text: str, trace: bool) -> Any:
    """The JSON of ``--body``; with ``--trace``, an object without ``exec_s`` (each
    request sets it)."""
    from deepboot.runtime.client.loadgen import EXEC_KEY

    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--body is not valid JSON: {exc}") from None
    if trace and not isinstance(body, dict):
        raise ConfigError(
            f"--body must be a JSON object with --trace (each request adds {EXEC_KEY!r} to it)"
        )
    if trace and EXEC_KEY in body:
        raise ConfigError(f"--body sets {EXEC_KEY!r}, which each trace row sets to its own")
    return body


def _endpoint(
    args: argparse.Namespace,
) -> tuple[Callable[[], tuple[str | Callable[[], Target], str | None]], list[PathArg]]:
    """(a function returning where the requests go and the token, the files read for
    them). Files are read here; the network is left to the function, which proves the
    endpoint once before anything is sent (:func:`deepboot.runtime.client.endpoint.prove`:
    without --url, the endpoint STATE_DIR/http.json records, whose instance id it
    checks too; with --url and --token-file, that URL) and returns, without --url, a
    function that re-reads http.json as each new connection opens. Each connection
    then proves itself again before it carries the token
    (:mod:`deepboot.runtime.client.provenhttp`)."""
    from deepboot.runtime.client.endpoint import Recorded, check_url, prove, read_record, read_token
    from deepboot.runtime.client.provenhttp import Target
    from deepboot.runtime.store.statedir import StateDir

    token_file = None
    if args.token_file is not None:
        token_file = require_path(args.token_file, "--token-file")
    if args.url is not None:
        try:
            url = check_url(args.url)
        except ValueError as exc:
            raise ConfigError(f"--url {exc}") from None
        if token_file is None:
            return (lambda: (url, None)), []
        token = read_token(token_file)

        def proved_url() -> tuple[str | Callable[[], Target], str | None]:
            prove(url, token, None, source="--url").close()
            return url, token

        return proved_url, [PathArg("--token-file", token_file)]
    state = StateDir.at(args.state_dir)
    if not state.http_file.exists():
        raise ConfigError(
            f"no HTTP endpoint recorded in {state.http_file} (is the controller up? run "
            "'deepboot up', or give --url)"
        )
    recorded = Recorded.read(state, Path(token_file) if token_file is not None else None)

    def locate() -> Target:
        """Where a new connection goes: what http.json records now."""
        url, instance = read_record(state.http_file)
        return Target(url, instance, "http.json")

    def checked() -> tuple[str | Callable[[], Target], str | None]:
        recorded.check().close()
        return locate, recorded.token

    inputs = [
        PathArg("http.json", str(state.http_file)),
        PathArg("--token-file", str(recorded.token_file)),
    ]
    return checked, inputs


class _LoadProgress:
    """The progress bar: requests answered of the total, and how many are in flight."""

    def __init__(self, console: Console, label: str, total: int, enabled: bool) -> None:
        self._progress = Progress(
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("answered  {task.fields[inflight]} in flight"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
            transient=True,
        )
        self._task = self._progress.add_task("load", total=total, inflight=0)

    def __call__(self, sent: int, answered: int, total: int) -> None:
        self._progress.update(self._task, completed=answered, inflight=sent - answered)

    def __enter__(self) -> _LoadProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


@dataclass(frozen=True, slots=True)
class _Schedule:
    """What one run sends: the requests, each service's SLO, the files read, and words
    for the progress bar (``label``) and the summary (``span``: what it lasts)."""

    requests: list[PlannedRequest]
    slo_wait_s: dict[str, float]
    inputs: list[PathArg]
    label: str
    span: str


def _profile_schedule(args: argparse.Namespace, registered: dict[str, ServiceRow]) -> _Schedule:
    """The rate profile's requests (``--rate-profile``, one service); its SLO is
    ``--slo-wait``, else the registered service's, else the default."""
    import numpy as np

    from deepboot.runtime.client.loadgen import PlannedRequest
    from deepboot.runtime.client.rateprofile import RateProfile, send_times

    path = require_path(args.rate_profile, "--rate-profile")
    profile = RateProfile.load(path)
    rng = np.random.default_rng(args.seed or 0) if args.poisson else None
    requests = [PlannedRequest(t, args.service) for t in send_times(profile, rng)]
    slo = args.slo_wait
    if slo is None:
        row = registered.get(args.service)
        slo = row.spec.slo_wait_s if row is not None else DEFAULT_SLO_WAIT_S
    return _Schedule(
        requests,
        {args.service: slo},
        [PathArg("--rate-profile", path)],
        f"load {args.service}",
        f"profile {profile.duration:g} s",
    )


def read_trace(path: str | Path, services: ServicesFile | None = None) -> Workload:
    """Read a DeepBoot-format workload for ``--trace`` with the simulator's reader
    (see :mod:`deepboot.runtime.client.tracereplay`).

    Args:
        path: The workload CSV.
        services: Its services file, or None (rows are ``infer-<model>-<k>``).

    Returns:
        The workload; its ``inference`` tasks are the requests to replay, sorted by
        submit time.

    Raises:
        InputError: what :func:`~deepboot.sim.workload.load_workload` raises (file,
            line, column), or a workload without inference rows (line 0, column
            ``application``).
    """
    from deepboot.perf.apps import load_apps
    from deepboot.sim.workload import load_workload

    if services is not None:
        # The reader asks every used service for a cold start because the simulator
        # needs one; a replay never uses it, and a runtime services file may leave it
        # to be measured. 0 stands in for "unknown" and goes no further than here.
        specs = {
            name: spec
            if spec.cold_start_s is not None
            else dataclasses.replace(spec, cold_start_s=0.0)
            for name, spec in services.specs.items()
        }
        services = dataclasses.replace(services, specs=MappingProxyType(specs))
    # The catalog's models: what DeepBoot's infer-<model>-<k> rows (and the training
    # rows, checked and then ignored) may name.
    try:
        workload = load_workload(path, load_apps().keys(), services=services)
    except InputError as exc:
        if services is None and exc.field == "application" and "infer-" in exc.message:
            # A trace whose services are named in a services file (the GenAI and
            # Azure conversions write one beside it): --service-map renames where
            # requests go, but the reader needs the file to know the rows.
            raise InputError(
                exc.path, exc.line, exc.field,
                f"{exc.message} (rows infer-<name> name services of a services file: "
                "give it with --services, e.g. the .toml written beside the trace)",
            ) from None  # fmt: skip
        raise
    if not workload.inference:
        raise InputError(
            str(path),
            0,
            "application",
            "no inference rows to replay (rows infer-<model>-<k>, or infer-<name> of "
            "--services' services, with the DeepBoot header ...,duration,num_task)",
        )
    return workload


def _trace_schedule(args: argparse.Namespace, registered: dict[str, ServiceRow]) -> _Schedule:
    """The trace's requests (``--trace``; see :mod:`deepboot.runtime.client.tracereplay`);
    each service's SLO is ``--slo-wait``, else the services file's, else the
    registered service's (by the name it is sent to), else the default."""
    from deepboot.runtime.client.tracereplay import parse_service_map, slo_waits
    from deepboot.runtime.client.tracereplay import trace_schedule as schedule

    path = require_path(args.trace, "--trace")
    mapping = parse_service_map(args.service_map)
    scale = 1.0 if args.time_scale is None else args.time_scale
    inputs = [PathArg("--trace", path)]
    if args.services is not None:
        inputs.append(PathArg("--services", require_path(args.services, "--services")))
    services = read_services_arg(args.services)
    workload = read_trace(path, services)
    requests = schedule(
        workload,
        path,
        time_scale=scale,
        service_map=mapping,
        start_s=0.0 if args.start is None else args.start,
        duration_s=args.duration,
        limit=args.limit,
    )
    span = requests[-1].due_s * scale  # trace seconds from the window's start
    waits = slo_waits(
        workload, mapping, None if services is None else services.specs, args.slo_wait
    )
    if args.slo_wait is None and services is None:
        waits |= {name: registered[name].spec.slo_wait_s for name in waits if name in registered}
    return _Schedule(
        requests,
        waits,
        inputs,
        f"replay {Path(path).name}",
        f"trace {span:g} s at --time-scale {scale:g}",
    )


def _free_name(path: str, force: bool) -> str:
    """``path``, or when it exists (and not ``force``) the first of ``stem-1.suffix``,
    ``stem-2.suffix``, ... that does not: a run never overwrites another's CSV
    unasked."""
    p = Path(path)
    if force or not p.exists():
        return path
    n = 1
    while (candidate := p.with_name(f"{p.stem}-{n}{p.suffix}")).exists():
        n += 1
    return str(candidate)


def _registered(args: argparse.Namespace) -> dict[str, ServiceRow]:
    """The services registered with the cluster of the state directory, by name: none
    with ``--url`` (another cluster's), or when the state has no store yet."""
    from deepboot.runtime.store.jobstore import JobStore
    from deepboot.runtime.store.statedir import StateDir

    if args.url is not None:
        return {}
    state = StateDir.at(args.state_dir)
    if not state.db.exists():
        return {}
    store = JobStore(state.db)
    try:
        return {row.spec.name: row for row in store.services()}
    finally:
        store.close()


def default_timeout(services: Sequence[ServiceRow]) -> float:
    """The default ``--timeout``: past the longest a router may keep a request of any of
    ``services`` plus :data:`TIMEOUT_MARGIN_S`, never below
    :data:`MIN_DEFAULT_TIMEOUT_S`. The longest: ``request_timeout_s`` waiting (for a
    replica, a cold start included) and ``handler_timeout_s`` running, and never less
    than its cold start (measured, else declared) plus ``request_timeout_s``."""
    longest = 0.0
    for row in services:
        spec = row.spec
        running = spec.handler_timeout_s or spec.request_timeout_s
        cold = row.cold_start if row.cold_start is not None else spec.cold_start_s
        longest = max(
            longest,
            spec.request_timeout_s + running,
            (cold or 0.0) + spec.request_timeout_s,
        )
    return min(MAX_TIMEOUT_S, max(MIN_DEFAULT_TIMEOUT_S, longest + TIMEOUT_MARGIN_S))


def cmd_load(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot load``: build the schedule, then send it and print the summary."""
    from deepboot.runtime.client.endpoint import EndpointError
    from deepboot.runtime.client.loadgen import LoadStopped, run_requests

    _check_args(args)
    requested = require_path(args.out, "--out")
    body = _body(args.body, args.trace is not None)
    endpoint, inputs = _endpoint(args)
    registered = _registered(args)
    if args.trace is not None:
        plan = _trace_schedule(args, registered)
    else:
        plan = _profile_schedule(args, registered)
    timeout = args.timeout
    if timeout is None:
        timeout = default_timeout([registered[n] for n in plan.slo_wait_s if n in registered])
    check_outputs([PathArg("--out", requested)], [*plan.inputs, *inputs])
    out_path = _free_name(requested, args.force)
    if out_path != requested:
        out.print(
            f"{args.out} exists (--force overwrites it): writing {out_path}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    where, token = endpoint()  # last, once every local input is good: the network
    show = not args.quiet and out.file.isatty()
    try:
        with _LoadProgress(out, plan.label, len(plan.requests), show) as progress:
            summary = asyncio.run(
                run_requests(
                    where,
                    plan.requests,
                    token,
                    lambda text: write_text(out_path, text),  # atomic, also on a stop
                    body,
                    timeout,
                    progress=progress,
                    max_connections=args.max_connections,
                    slo_wait_s=plan.slo_wait_s,
                )
            )
    except LoadStopped as exc:
        raise EndpointError(
            f"{exc.reason}; load stopped at once: {exc.sent} of {exc.total} requests "
            f"were sent, each answer on a proven connection, all recorded in {out_path}"
        ) from None
    _print_summary(out, summary, plan, args, timeout)
    if token is not None:
        out.print(
            "every answer came on a connection that proved it holds the token "
            "(GET /healthz's challenge) before the token went on it"
        )
    else:
        out.print(
            "[yellow]note:[/] no token was sent (--url without --token-file), so no "
            "connection proved anything: the answers are unproven"
        )
    out.print(f"requests: {Path(out_path)}")
    return 0


_ERROR_WORDS = MappingProxyType(
    {
        "timeout": "timed out after {timeout:g} s (--timeout)",
        "not sent": "not sent (the endpoint did not prove it holds the token)",
        "cancelled": "cancelled (the run was stopped)",
    }
)
"""Words for the kinds of status-0 records (the record's ``error`` before its colon)."""


def _status_label(status: int, errors: dict[str, int], timeout: float) -> str:
    """A status row's label in words: ``200 OK``, ``503 Service Unavailable``, or
    what happened to the requests with no HTTP answer."""
    from http import HTTPStatus

    if status == 0:
        kinds = "; ".join(
            f"{n} {_ERROR_WORDS.get(k, k).format(timeout=timeout)}" for k, n in errors.items()
        )
        return f"no answer: {kinds}"
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def _print_summary(
    out: Console,
    summary: LoadSummary,
    plan: _Schedule,
    args: argparse.Namespace,
    timeout: float,
) -> None:
    """Answers by status, latency of the 200s, SLO attainment per service (the
    warm-up apart), warnings."""
    services = list(summary.slo)
    to = services[0] if len(services) == 1 else f"{len(services)} services"
    table = Table(title=f"{summary.sent} requests to {to}", title_justify="left")
    table.add_column("status")
    table.add_column("requests", justify="right")
    table.add_column("share", justify="right")
    for status, n in summary.by_status.items():
        share = f"{100 * n / summary.sent:.1f} %" if summary.sent else "-"
        table.add_row(_status_label(status, summary.errors, timeout), str(n), share)
    out.print(table)
    out.print(
        f"latency of the {summary.ok} 200s: p50 {_ms(summary.p50_s)}, p95 "
        f"{_ms(summary.p95_s)}, p99 {_ms(summary.p99_s)}, max {_ms(summary.max_s)}; "
        f"ran {summary.duration_s:.1f} s ({plan.span})"
    )
    slo = Table(
        title="SLO attainment (wait to a ready replica)",
        title_justify="left",
        caption="warm-up: requests sent before the service's first replica was ready, "
        "when that took longer than the SLO (they waited for its first cold start)",
        caption_justify="left",
    )
    for column in ("service", "SLO wait", "requests", "met", "all", "warm-up", "after it"):
        slo.add_column(column, justify="left" if column == "service" else "right")
    estimated = 0
    for name, s in summary.slo.items():
        after = s.after_warm_up
        slo.add_row(
            name,
            f"{s.slo_wait_s:g} s",
            str(s.requests),
            str(s.met),
            "-" if s.attainment is None else f"{100 * s.attainment:.1f} %",
            f"{s.warm_up} ({s.warm_up_met} met)",
            "-" if after is None else f"{100 * after:.1f} %",
        )
        estimated += s.estimated
    out.print(slo)
    if estimated:
        out.print(
            f"[yellow]note:[/] {estimated} answers had no X-Wait-Ms header (a router "
            "without it): their wait is estimated as latency minus exec_s, which counts "
            "the network and the router's own time too, so it is pessimistic"
        )
    if args.trace is not None and args.time_scale not in (None, 1.0):
        from deepboot.runtime.client.tracereplay import COMPRESSION_NOTE

        out.print(f"[yellow]note:[/] {COMPRESSION_NOTE}")
    if summary.max_send_lag_s > 0.1:
        out.print(
            f"[yellow]warning:[/] some requests went out up to {summary.max_send_lag_s:.2f} s "
            "late: this machine did not keep up with the schedule"
        )
