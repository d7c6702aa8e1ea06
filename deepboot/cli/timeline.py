"""``deepboot timeline STATE_DIR``: draw a runtime run's timeline from its event log
(see :mod:`deepboot.report.timeline` and :mod:`deepboot.report.timeline_figure`)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console

from deepboot.cli.files import PathArg, check_outputs, require_path, write_bytes
from deepboot.core.errors import ConfigError
from deepboot.runtime.client.statusdoc import read_state_dir
from deepboot.runtime.cluster.processes import controller_alive
from deepboot.runtime.store.statedir import StateDir

if TYPE_CHECKING:
    pass

_EPILOG = """\
What the picture shows, on one time axis (seconds since the controller started):
  - each GPU pool's GPUs by state: used by training jobs (on the inference pool:
    lent to them), holding an inference replica, idle, down;
  - each training job's workers (a red triangle: a lent GPU of it was reclaimed;
    every reclaim is also a dotted red line through all panels);
  - with --requests: each request's wait (the CSV's wait_s column, else its
    latency_s) against the --slo-wait line; requests not answered 200 are crosses.

The --requests CSV's send_s counts from the load's own start; its sent_at column
(each request's Unix send time) puts it on the log's clock. A CSV without sent_at
(an older deepboot load's) is aligned by its first request to the log's first
replica start (the load's first request cold-starts the service's first replica);
give --load-offset when that is not so (a replica started before the load, or a
service registered earlier).

It reads the store only: a running controller's directory may be drawn too (the
picture ends at the log's newest entry).

examples (without STATE_DIR: the default state directory, as 'deepboot up' uses):
  deepboot timeline
  deepboot timeline --requests requests.csv --slo-wait 0.5 --out run.png
  deepboot timeline --last 3600 --out last-hour.png   # the dashboard's picture
  deepboot timeline out/demo-runtime/state --requests requests.csv --load-offset 12.5"""


def add_parser(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``deepboot timeline`` to the ``deepboot`` parser."""
    p: argparse.ArgumentParser = sub.add_parser(
        "timeline",
        help="draw a runtime run's GPUs, jobs and requests over time (PNG)",
        description="Draw a runtime run's timeline from its state directory's event log "
        "as one PNG: GPUs by state per pool, training jobs' workers, reclaims, and "
        "optionally the requests of a 'deepboot load' CSV against an SLO line. Prints "
        "the PNG's path (matplotlib, part of the base install).",
        epilog=_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument(
        "state_dir",
        metavar="STATE_DIR",
        nargs="?",
        help="the run's state directory (the --state-dir of 'deepboot up'; holds "
        "deepboot.db); default: the one 'deepboot up' uses without --state-dir",
    )
    p.add_argument(
        "--requests", metavar="CSV", help="a 'deepboot load' requests CSV to plot (--out of load)"
    )
    p.add_argument(
        "--slo-wait",
        type=float,
        default=1.0,
        metavar="S",
        help="the requests' SLO in seconds (> 0), drawn as a horizontal line",
    )
    p.add_argument(
        "--load-offset",
        type=float,
        default=None,
        metavar="S",
        help="the controller's second at which the load's send_s was 0; without it, "
        "the CSV's sent_at column says, else the first request is aligned to the "
        "log's first replica start",
    )
    p.add_argument(
        "--last",
        type=float,
        default=None,
        metavar="S",
        help="draw only the last S seconds (> 0): up to now while the controller runs "
        "(the states the log left hold until now), else up to the log's newest entry",
    )
    p.add_argument(
        "--title",
        default=None,
        metavar="TEXT",
        help="the picture's title (default: 'Runtime timeline: STATE_DIR', and the span "
        "with --last)",
    )
    p.add_argument(
        "--out",
        default="timeline.png",
        metavar="PNG",
        help="the picture (written atomically)",
    )
    p.set_defaults(func=cmd_timeline)


def cmd_timeline(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Draw the timeline of ``args.state_dir``; print the PNG's path.

    Raises:
        ConfigError: a bad flag, no store in STATE_DIR, an unreadable CSV, an output
            that would overwrite an input.
        MissingDependencyError: matplotlib is missing (checked before reading).
    """
    from deepboot.report.timeline import (
        align_requests,
        build_timeline,
        load_offset,
        read_requests,
        sent_offset,
    )
    from deepboot.report.timeline_figure import require_matplotlib, timeline_figure

    state_dir = require_path(
        args.state_dir if args.state_dir is not None else str(StateDir.at(None).root),
        "STATE_DIR",
    )
    target = require_path(args.out, "--out")
    if not (math.isfinite(args.slo_wait) and args.slo_wait > 0):
        raise ConfigError(f"--slo-wait must be a positive number of seconds, got {args.slo_wait}")
    if args.load_offset is not None and not math.isfinite(args.load_offset):
        raise ConfigError(f"--load-offset must be a number of seconds, got {args.load_offset}")
    if args.last is not None and not (math.isfinite(args.last) and args.last > 0):
        raise ConfigError(f"--last must be a positive number of seconds, got {args.last}")
    if args.load_offset is not None and args.requests is None:
        raise ConfigError("--load-offset shifts the --requests CSV; add --requests")
    inputs = [PathArg("STATE_DIR", state_dir)]  # the PNG is never written inside it
    if args.requests is not None:
        inputs.append(PathArg("--requests", require_path(args.requests, "--requests")))
    check_outputs([PathArg("--out", target)], inputs)
    require_matplotlib()  # a missing matplotlib fails before any reading
    events, pools = read_state_dir(state_dir)
    timeline = build_timeline(events, pools)
    since = None
    if args.last is not None:
        if controller_alive(StateDir.at(state_dir)) is not None:
            now = time.time() - timeline.start
            timeline = dataclasses.replace(timeline, end=max(timeline.end, now))
        since = timeline.end - args.last
    requests = None
    if args.requests is not None:
        metric, rows = read_requests(args.requests)
        offset = args.load_offset
        if offset is None:
            offset = sent_offset(rows, timeline.start)
        if offset is None:  # a CSV without sent_at: guess from the log
            first = min((r.send_s for r in rows), default=0.0)
            offset = load_offset(events, timeline.start, first)
        requests = align_requests(metric, rows, offset)
    for note in timeline.notes:
        err.print(f"deepboot: warning: {note}", markup=False, highlight=False)
    title = args.title
    if title is None:
        title = f"Runtime timeline: {state_dir}"
        if args.last is not None:
            title += f", the last {_span(args.last)}"
    png = timeline_figure(timeline, requests, args.slo_wait, title=title, since=since)
    path = write_bytes(target, png)
    out.print(str(path), markup=False, highlight=False, soft_wrap=True)
    return 0


def _span(seconds: float) -> str:
    """``3600`` -> "hour", ``600`` -> "10 minutes", ``45`` -> "45 s"."""
    if seconds == 3600:
        return "hour"
    if seconds >= 120 and seconds % 60 == 0:
        return f"{seconds / 60:g} minutes"
    return f"{seconds:g} s"
