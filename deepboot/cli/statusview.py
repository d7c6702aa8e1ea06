"""``deepboot status --watch``: the status document (:mod:`deepboot.runtime.client.statusdoc`)
as one screen that fits the terminal, redrawn every few seconds.

:func:`status_view` is pure (a document and a width in, a rich renderable out), so
tests render it into a ``Console(width=80, record=True)``; :func:`watch` is the loop
(rich's ``Live``), with its clock, sleep and number of refreshes injectable.

Every row is one line: long names (jobs, services, GPU holders, models) are cut
with an ellipsis, never folded; the name columns get what the other (short) columns
leave of the width.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

DEFAULT_EVERY_S = 2.0
# A tick whose read fails tries again this many times in all, with a short pause
# in between, then shows why and waits for the next tick.
READ_ATTEMPTS = 3

# Column widths never go below these, whatever the width: past that, rich cuts the
# other columns too (a terminal narrower than ~50 columns).
_MIN_NAME = 10
_MIN_GPU_CELL = 18

STATE_STYLE = {
    # GPUs
    "free": "dim",
    "training": "green",
    "lent": "yellow",
    "running": "cyan",
    "protect": "magenta",
    "sleep": "blue",
    # jobs
    "submitted": "dim",
    "queued": "dim",
    "finished": "green",
    "failed": "bold red",
    "cancelled": "dim",
}
# Replica states, shortest first in a service's replicas cell.
_REPLICA_ABBREV = {"running": "run", "protect": "prot", "sleep": "sleep"}


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _line(*parts: str | tuple[str, str]) -> Text:
    """One line of text that is cut with an ellipsis, never folded."""
    text = Text.assemble(*parts)
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def attained(counts: dict[str, Any], compact: bool = False) -> str:
    """``98.5% (197/200)`` (``compact``: ``98.5% 197/200``), or ``-`` before any
    answer; ``counts`` as the status document's ``slo.recent`` / ``slo.total``."""
    total = counts["within"] + counts["over"]
    if not total:
        return "-"
    share = f"{100.0 * counts['attainment']:.1f}%"
    tally = f"{counts['within']}/{total}"
    return f"{share} {tally}" if compact else f"{share} ({tally})"


def _with_time(width: int, left: Text, when: Text) -> Table:
    """``left``, cut to leave room for ``when`` at the right end of the line."""
    grid = Table.grid(padding=(0, 0, 0, 1))
    grid.width = width
    grid.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    grid.add_column(no_wrap=True, justify="right")
    grid.add_row(left, when)
    return grid


def _header(
    doc: dict[str, Any] | None,
    source: str,
    refreshed: float,
    every: float | None,
    width: int,
) -> list[RenderableType]:
    lines: list[RenderableType] = []
    when = Text(_clock(refreshed), style="bold")
    if doc is None:
        lines.append(_with_time(width, _line(("deepboot ", "bold"), source), when))
        return lines
    c = doc["cluster"]
    where = f"{c['mode']} {c['address'] or ''}".rstrip() if c["up"] else "down"
    if c["controller_pid"]:
        ctl: tuple[str, str] = (f"controller up, pid {c['controller_pid']}", "green")
    else:
        ctl = ("controller DOWN", "bold red")
    age = c["heartbeat_age_s"]
    beat = f" · heartbeat {age:.1f} s ago" if age is not None else " · no heartbeat"
    lines.append(_with_time(width, _line((where, "bold"), " · ", ctl, beat), when))
    configuration = doc.get("configuration")
    if configuration:
        lines.append(_line(("runs ", "dim"), configuration["described"]))
    s = doc.get("scheduler") or {}
    parts = [f"every {every:g} s"] if every else []
    if c["endpoint"]:
        parts.append(c["endpoint"])
    if s:
        rounds = f"{s.get('rounds', 0)} rounds"
        if s.get("decision_ms_median") is not None:
            rounds += f", {s['decision_ms_median']:g} ms median, {s['decision_ms_max']:g} ms max"
        parts.append(rounds)
    if parts:
        lines.append(_line((" · ".join(parts), "dim")))
    if not c["controller_pid"]:
        lines.append(_line(("the controller is not running: this is its last record", "yellow")))
    return lines


def _gpu_cell(g: dict[str, Any]) -> Text:
    holder = g.get("holder") or g.get("service") or ""
    text = _line((g["gpu"], "bold"), " ", (g["state"], STATE_STYLE.get(g["state"], "")))
    if holder:
        text.append(" " + holder)
    return text


def _gpu_grid(gpus: Sequence[dict[str, Any]], width: int) -> RenderableType:
    """One line per node (more when its GPUs do not fit one): its pool, then each
    GPU's id, state and holder (a job, or a replica's service)."""
    nodes: dict[int, list[dict[str, Any]]] = {}
    for g in gpus:
        nodes.setdefault(g["node"], []).append(g)
    labels = {n: f"{n} {gs[0]['pool']}" for n, gs in nodes.items()}
    label_w = max(len(x) for x in labels.values())
    widest = max(len(gs) for gs in nodes.values())
    room = width - label_w
    # Each cell takes 1 column of gap before it. As few lines per node as the
    # narrowest cells allow, then as wide cells as that many lines allow.
    most = max(1, room // (_MIN_GPU_CELL + 1))
    lines = -(-widest // most)
    per_line = -(-widest // lines)
    cell_w = max(1, room // per_line - 1)
    grid = Table.grid(padding=(0, 0, 0, 1))
    grid.add_column(no_wrap=True, width=label_w, style="dim")
    for _ in range(per_line):
        grid.add_column(no_wrap=True, overflow="ellipsis", width=cell_w, max_width=cell_w)
    for n in sorted(nodes):
        gs = nodes[n]
        for i in range(0, len(gs), per_line):
            cells: list[RenderableType] = [_gpu_cell(g) for g in gs[i : i + per_line]]
            cells += [""] * (per_line - len(cells))
            grid.add_row(labels[n] if i == 0 else "", *cells)
    return grid


def column_widths(headers: Sequence[str], rows: Sequence[Sequence[str | Text]]) -> list[int]:
    """The widest cell of each column, its header included."""
    natural = [Text(h).cell_len for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            natural[i] = max(
                natural[i], Text(cell).cell_len if isinstance(cell, str) else cell.cell_len
            )
    return natural


def share_room(
    natural: Sequence[int], elastic: Sequence[tuple[int, int]], room: int, least: int
) -> dict[int, int]:
    """The widths of the ``elastic`` columns ((index, weight) pairs) that share
    ``room`` columns by weight, none wider than it needs (``natural``) nor narrower
    than ``least`` (then the sum may exceed ``room``)."""
    weight = sum(w for _, w in elastic)
    caps = {i: min(natural[i], max(least, room * w // weight)) for i, w in elastic}
    # One held at ``least`` takes its excess from the widest of the others.
    while sum(caps.values()) > room and max(caps.values()) > least:
        widest = max(caps, key=lambda i: caps[i])
        caps[widest] -= 1
    # Give what one does not need to the others, in order.
    spare = room - sum(caps.values())
    for i, _ in elastic:
        more = max(0, min(spare, natural[i] - caps[i]))
        caps[i] += more
        spare -= more
    return caps


def _fitted_table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str | Text]],
    width: int,
    elastic: Sequence[tuple[int, int]],
    right: Sequence[int] = (),
) -> Table:
    """A one-line-per-row table of ``width`` columns at most: the columns in
    ``elastic`` ((index, weight) pairs: the names) share what the others' widest
    cells leave, by weight; every cell is cut with an ellipsis, never folded. The
    columns in ``right`` (numbers) are right-justified."""
    natural = column_widths(headers, rows)
    # Between two columns: a space of padding and the box's (blank) divider.
    gaps = 2 * (len(headers) - 1)
    names = dict(elastic)
    fixed = sum(w for i, w in enumerate(natural) if i not in names)
    caps = share_room(natural, elastic, width - fixed - gaps, _MIN_NAME) if elastic else {}
    table = Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        header_style="bold dim",
    )
    for i, h in enumerate(headers):
        table.add_column(
            h,
            no_wrap=True,
            overflow="ellipsis",
            max_width=caps.get(i),
            justify="right" if i in right else "left",
        )
    for row in rows:
        table.add_row(*row)
    return table


def jobs_table(jobs: Sequence[dict[str, Any]], width: int, cut_names: bool = True) -> Table:
    """The compact jobs table, one line per job, ``width`` columns at most; with
    ``cut_names`` False, names are never cut (then it is wider when they need it)."""
    rows = []
    for j in jobs:
        lent = len(j["lent_gpus"])
        workers = str(j["num_workers"]) + (f" ({lent} lent)" if lent else "")
        rows.append(
            [
                j["name"],
                Text(j["state"], style=STATE_STYLE.get(j["state"], "")),
                workers,
                str(j["batch_size"] or "-"),
                str(j["step"]),
                f"{j['loss']:.4g}" if j["loss"] is not None else "-",
                str(j["restarts"]),
            ]
        )
    headers = ("job", "state", "workers", "batch", "step", "loss", "resizes")
    names = [(0, 1)] if cut_names else []
    return _fitted_table("jobs", headers, rows, width, names, right=(3, 4, 5, 6))


def _replicas(sv: dict[str, Any]) -> str:
    counts = Counter(r["state"] for r in sv["replicas"])
    total = sum(counts.values())
    cap = f"/{sv['max_replicas']}" if sv["max_replicas"] else ""
    if not total:
        return f"0{cap}"
    by_state = " ".join(f"{n} {_REPLICA_ABBREV.get(s, s)}" for s, n in sorted(counts.items()))
    return f"{total}{cap}: {by_state}"


def services_table(services: Sequence[dict[str, Any]], width: int, cut_names: bool = True) -> Table:
    """The compact services table, one line per service, ``width`` columns at most;
    with ``cut_names`` False, names and models are never cut (then it is wider when
    they need it)."""
    with_p99 = any("p99_wait_s" in sv.get("slo", {}) for sv in services)
    rows = []
    for sv in services:
        slo = sv["slo"]
        row = [
            sv["name"],
            sv["model"],
            _replicas(sv),
            f"{slo['slo_wait_s']:g}s@{100.0 * slo['slo_target']:g}%",
            attained(slo["recent"], compact=True),
        ]
        if with_p99:
            p99 = slo.get("p99_wait_s")
            row.append(f"{p99:.2f} s" if p99 is not None else "-")
        rows.append(row)
    headers = ["service", "model", "replicas", "SLO", "last 5 min"]
    if with_p99:
        headers.append("p99 wait")
    names = [(0, 2), (1, 1)] if cut_names else []
    return _fitted_table("services", headers, rows, width, names, right=(4, 5))


def demand_line(sv: dict[str, Any]) -> str | None:
    """A service's demand as the SLO guard reads it, in one line (None without
    ``--slo`` or before its first arrival): ``chat: forecast 2.60/s, dispersion 9.8
    (busiest second 41), 12 replicas sized``."""
    d = sv.get("demand")
    if not d:
        return None
    bursts = f"dispersion {d['dispersion']:.1f}"
    if d["peakedness"] == 1.0 and d["dispersion"] > 1.0:
        bursts += " (Poisson within noise)"
    return (
        f"{sv['name']}: forecast {d['forecast_rps']:.2f}/s, {bursts}, busiest second "
        f"{d['peak_per_s']}, {d['sized']} replicas sized"
    )


def _notes(doc: dict[str, Any], now: float) -> list[RenderableType]:
    """Back-offs, the guard's demand and the model caches, one cut line each."""
    lines: list[RenderableType] = []
    for sv in doc["services"]:
        demand = demand_line(sv)
        if demand:
            lines.append(_line(("demand ", "dim"), demand))
        if sv["load_failures"]:
            left = (sv["backoff_until"] or now) - now
            wait = f"back-off {left:.0f} s left" if left > 0 else "back-off over"
            lines.append(
                _line((sv["name"], "bold"), f": {sv['load_failures']} failed loads; {wait}")
            )
    for c in doc.get("caches") or []:
        used = f"{c['used_bytes'] / 1e9:.3f}/{c['bound_bytes'] / 1e9:.3f} GB"
        models = ", ".join(c["models"]) or "empty"
        lines.append(_line(("cache ", "dim"), f"node {c['node']} ({used}): {models}"))
    return lines


def status_view(
    doc: dict[str, Any] | None,
    width: int = 80,
    *,
    refreshed: float | None = None,
    problem: str | None = None,
    read_at: float | None = None,
    source: str = "",
    every: float | None = None,
) -> RenderableType:
    """The screen ``status --watch`` shows: a header (cluster, controller, heartbeat,
    time of ``refreshed``), the GPUs by node, the services and the jobs, each row one
    line of ``width`` columns at most.

    Args:
        doc: A status document (:func:`deepboot.runtime.client.statusdoc.status_document`),
            or None when none could be read yet.
        width: The terminal's width.
        refreshed: When the screen was made (Unix time; default now).
        problem: Why the latest read failed (then ``doc`` is the last one read, if any).
        read_at: When ``doc`` was read, named with a ``problem``.
        source: The state directory, named when there is no document.
        every: The refresh period, shown in the header.
    """
    refreshed = time.time() if refreshed is None else refreshed
    parts: list[RenderableType] = _header(doc, source, refreshed, every, width)
    if problem is not None:
        stale = ""
        if doc is not None:
            at = f" at {_clock(read_at)}" if read_at is not None else ""
            stale = f" (shown: the state read{at})"
        parts.append(Text(f"cannot read the status: {problem}; retrying{stale}", "bold red"))
    if doc is None:
        return Group(*parts)
    if doc["gpus"]:
        parts += [Text(""), _gpu_grid(doc["gpus"], width)]
    if doc["services"]:
        parts += [Text(""), services_table(doc["services"], width)]
    parts += _notes(doc, refreshed)
    parts.append(Text(""))
    if doc["jobs"]:
        parts.append(jobs_table(doc["jobs"], width))
    else:
        parts.append(Text("no jobs", style="dim"))
    return Group(*parts)


def _describe(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    return message if message else type(exc).__name__


def read_once(
    read: Callable[[], dict[str, Any]],
    sleep: Callable[[float], None],
    attempts: int = READ_ATTEMPTS,
    pause: float = 0.2,
) -> tuple[dict[str, Any] | None, str | None]:
    """``read()``, tried ``attempts`` times at most (``pause`` seconds apart): the
    document, or None and why the last try failed. The controller writes the store
    while it is read, and the state directory may vanish (``deepboot down``)."""
    problem = "no attempt"
    for attempt in range(attempts):
        try:
            return read(), None
        except Exception as exc:  # whatever the read raised: shown, watched again
            problem = _describe(exc)
        if attempt + 1 < attempts:
            sleep(pause)
    return None, problem


def watch(
    read: Callable[[], dict[str, Any]],
    console: Console,
    every: float = DEFAULT_EVERY_S,
    *,
    source: str = "",
    max_refreshes: int | None = None,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> int:
    """Show :func:`status_view` of ``read()`` on ``console``, redrawn every ``every``
    seconds, until Ctrl-C (or ``max_refreshes`` screens); returns 0.

    A failed read shows why above the last document read, and the next tick tries
    again. The cursor is restored however it ends. ``sleep`` and ``clock`` default
    to ``time.sleep`` and ``time.time``.
    """
    sleep = time.sleep if sleep is None else sleep
    clock = time.time if clock is None else clock
    last: dict[str, Any] | None = None
    read_at: float | None = None
    done = 0
    live = Live(
        console=console,
        auto_refresh=False,
        redirect_stdout=False,
        redirect_stderr=False,
    )
    try:
        with live:
            while True:
                doc, problem = read_once(read, sleep, pause=min(0.2, every / 10))
                now = clock()
                if doc is not None:
                    last, read_at = doc, now
                view = status_view(
                    last,
                    console.width,
                    refreshed=now,
                    problem=problem,
                    read_at=read_at,
                    source=source,
                    every=every,
                )
                live.update(view, refresh=True)
                done += 1
                if max_refreshes is not None and done >= max_refreshes:
                    break
                sleep(every)
    except KeyboardInterrupt:
        pass
    return 0
