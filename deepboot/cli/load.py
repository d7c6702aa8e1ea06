"""``deepboot load SERVICE --rate-profile FILE``: drive a service's HTTP endpoint with
a rate profile and record every request (see :mod:`deepboot.runtime.loadgen`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from deepboot.cli import limits
from deepboot.cli.files import PathArg, check_outputs, require_path, write_text
from deepboot.core.errors import ConfigError

MAX_TIMEOUT_S = 3600.0
"""``0 < --timeout <= MAX_TIMEOUT_S``."""
MAX_CONNECTIONS = 65_535
"""``1 <= --max-connections <= MAX_CONNECTIONS``."""

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

The requests CSV has one row per request: id,send_s,answer_s,status,latency_s,error
(seconds since the start; status 0: no HTTP answer, see error: timeout, a connection
error; a redirect is recorded, not followed).

The endpoint: without --url, the one STATE_DIR/http.json records, and only once its
GET /healthz has echoed the instance id of http.json (else http.json is stale, and
whatever listens at its URL now is not the controller: nothing is sent, the token
least of all); then every request carries the bearer token of STATE_DIR/http-token
(or --token-file). With --url nothing is checked: the requests go to that URL as
given, with the token of --token-file if given (without one, the endpoint answers
401)."""


def add_parser(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``deepboot load`` to the ``deepboot`` parser."""
    p: argparse.ArgumentParser = sub.add_parser(
        "load",
        help="send requests to an inference service following a rate profile",
        description="Send POST /v1/SERVICE/infer requests to the runtime's HTTP endpoint "
        "at the rates of a profile, record each answer in a CSV and print a summary "
        "(answers by status, latency percentiles of the 200s).",
        epilog=_LOAD_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument("service", metavar="SERVICE", help="the inference service's name")
    p.add_argument(
        "--rate-profile",
        required=True,
        metavar="FILE",
        help="CSV time_s,rps (see below)",
    )
    p.add_argument(
        "--out",
        default="requests.csv",
        metavar="FILE",
        help="the requests CSV (written atomically; not an input file)",
    )
    p.add_argument("--body", default="{}", metavar="JSON", help="JSON body of every request")
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help=f"client-side limit of one request in seconds, 0 < S <= {MAX_TIMEOUT_S:g}; "
        "past it the request is recorded as status 0, timeout",
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
        help=f"most connections open at once, 1 <= N <= {MAX_CONNECTIONS}",
    )
    p.add_argument(
        "--state-dir",
        default=".deepboot",
        metavar="DIR",
        help="the runtime's state directory (http.json, http-token)",
    )
    p.add_argument(
        "--url",
        metavar="URL",
        help="the endpoint's base URL, http://HOST:PORT, taken as given (not checked); "
        "without it, STATE_DIR/http.json's, once the controller there proves itself",
    )
    p.add_argument(
        "--token-file",
        metavar="F",
        help="file holding the bearer token; without it, STATE_DIR/http-token (none with --url)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_load)


def _check_args(args: argparse.Namespace) -> None:
    if not _SERVICE.fullmatch(args.service):
        raise ConfigError(
            f"service name {args.service!r}: use letters, digits and _.- (at most 63)"
        )
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= MAX_TIMEOUT_S):
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


def _body(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--body is not valid JSON: {exc}") from None


def _endpoint(
    args: argparse.Namespace,
) -> tuple[Callable[[], tuple[str, str | None]], list[PathArg]]:
    """(a function returning the URL and the token to send it, the files read for
    them). Files are read here; the network is left to the function: without --url,
    it checks the endpoint that STATE_DIR/http.json records
    (:meth:`deepboot.runtime.endpoint.Recorded.check`)."""
    from deepboot.runtime.endpoint import Recorded, check_url, read_token
    from deepboot.runtime.statedir import StateDir

    token_file = None
    if args.token_file is not None:
        token_file = require_path(args.token_file, "--token-file")
    if args.url is not None:
        try:
            url = check_url(args.url)
        except ValueError as exc:
            raise ConfigError(f"--url {exc}") from None
        token = read_token(token_file) if token_file is not None else None
        inputs = [PathArg("--token-file", token_file)] if token_file is not None else []
        return (lambda: (url, token)), inputs
    state = StateDir.at(args.state_dir)
    if not state.http_file.exists():
        raise ConfigError(
            f"no HTTP endpoint recorded in {state.http_file} (is the controller up? run "
            "'deepboot up', or give --url)"
        )
    recorded = Recorded.read(state, Path(token_file) if token_file is not None else None)

    def checked() -> tuple[str, str | None]:
        endpoint = recorded.check()
        return endpoint.url, endpoint.token

    inputs = [
        PathArg("http.json", str(state.http_file)),
        PathArg("--token-file", str(recorded.token_file)),
    ]
    return checked, inputs


class _LoadProgress:
    """The progress bar: requests answered of the total, and how many are in flight."""

    def __init__(self, console: Console, service: str, total: int, enabled: bool) -> None:
        self._progress = Progress(
            TextColumn(f"load {service}"),
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


def cmd_load(args: argparse.Namespace, out: Console, err: Console) -> int:
    import numpy as np

    from deepboot.runtime.loadgen import run_load
    from deepboot.runtime.rateprofile import RateProfile, send_times

    _check_args(args)
    profile_path = require_path(args.rate_profile, "--rate-profile")
    out_path = require_path(args.out, "--out")
    body = _body(args.body)
    endpoint, inputs = _endpoint(args)
    profile = RateProfile.load(profile_path)
    check_outputs([PathArg("--out", out_path)], [PathArg("--rate-profile", profile_path), *inputs])
    url, token = endpoint()  # last, once every local input is good: the network
    rng = np.random.default_rng(args.seed or 0) if args.poisson else None
    times = send_times(profile, rng)
    show = not args.quiet and out.file.isatty()
    with _LoadProgress(out, args.service, len(times), show) as progress:
        summary = asyncio.run(
            run_load(
                url,
                args.service,
                times,
                token,
                lambda text: write_text(out_path, text),  # atomic, also on Ctrl-C
                body,
                args.timeout,
                progress=progress,
                max_connections=args.max_connections,
            )
        )

    table = Table(title=f"{summary.sent} requests to {args.service}", title_justify="left")
    table.add_column("status")
    table.add_column("requests", justify="right")
    table.add_column("share", justify="right")
    for status, n in summary.by_status.items():
        share = f"{100 * n / summary.sent:.1f} %" if summary.sent else "-"
        if status == 0:
            kinds = ", ".join(f"{k} {v}" for k, v in summary.errors.items())
            label = f"no answer ({kinds})"
        else:
            label = str(status)
        table.add_row(label, str(n), share)
    out.print(table)
    out.print(
        f"latency of the {summary.ok} 200s: p50 {_ms(summary.p50_s)}, p95 "
        f"{_ms(summary.p95_s)}, p99 {_ms(summary.p99_s)}, max {_ms(summary.max_s)}; "
        f"ran {summary.duration_s:.1f} s (profile {profile.duration:g} s)"
    )
    if summary.max_send_lag_s > 0.1:
        out.print(
            f"[yellow]warning:[/] some requests went out up to {summary.max_send_lag_s:.2f} s "
            "late: this machine did not keep up with the profile"
        )
    out.print(f"requests: {Path(out_path)}")
    return 0
