"""A runtime run's timeline, rebuilt from its state directory's event log.

Pure reconstruction (no matplotlib, no store): :func:`build_timeline` turns the
event log (rows shaped as :class:`~deepboot.runtime.store.jobstore.EventRow`, see
:class:`EventLike`) and each GPU's pool into step series; :func:`read_requests` and
:func:`align_requests` put a ``deepboot load`` requests CSV on the same clock.
``deepboot timeline`` (:mod:`deepboot.cli.timeline`) reads the state directory, and
:mod:`deepboot.report.timeline_figure` draws the result. (``report`` sits below
``runtime`` in the package's layers, so the log's kinds are matched by their values
here; a test checks them against :class:`~deepboot.runtime.store.jobstore.LogKind`.)

The clock: seconds since the controller started (the log's first
``controller_started`` entry). Every series is a step function: value ``i`` holds
from ``times[i]`` until ``times[i + 1]`` (the last until :attr:`Timeline.end`);
several entries at one instant leave one point, the state after all of them.

What the log says about a GPU (and therefore what the series can show):

* ``gpu`` entries: ``bind`` (a training-pool GPU to a job), ``lend`` (an
  inference-pool GPU to a job), ``release`` (a job gave it back), ``reclaim``
  (inference took a lent GPU back).
* ``replica`` entries: ``start`` (a new replica, a cold start) until ``evict`` or
  ``died``. Warm reuses and PROTECT are not logged, and ``sleep`` is logged but its
  wake-up is not, so a GPU holding a replica is one state, ``replica``, whether it
  serves, loads or idles warm.
* ``node`` entries: ``left`` (its GPUs ``down``, holding nothing) and ``returned``.

Not modelled: a controller restart's recovery (a GPU it frees without a log entry
keeps its logged state), and a log whose oldest entries retention pruned (the series
then start from the oldest entry kept, with every GPU idle; a note says so).
"""

from __future__ import annotations

import csv
import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from deepboot.core.errors import ConfigError

TRAINING_POOL = "training"
INFERENCE_POOL = "inference"

JOB = "job"
REPLICA = "replica"
IDLE = "idle"
DOWN = "down"
GPU_STATES: tuple[str, ...] = (JOB, REPLICA, IDLE, DOWN)
"""What a GPU is doing, as far as the log tells: held by a training job's worker
(on an inference-pool GPU: lent), holding an inference replica, idle, or its node
left the cluster."""

# The event log's kinds this module reads (values of runtime.store.LogKind).
CONTROLLER_STARTED = "controller_started"
SUBMITTED = "submitted"
STARTED = "started"
RESIZED = "resized"
PREEMPTED = "preempted"
GPU = "gpu"
REPLICA_KIND = "replica"
NODE = "node"
ENDED: tuple[str, ...] = ("finished", "failed", "cancelled")


class KindLike(Protocol):
    """An event's kind: ``LogKind``, read by its value."""

    @property
    def value(self) -> str: ...


class EventLike(Protocol):
    """One entry of the event log (:class:`~deepboot.runtime.store.jobstore.EventRow`)."""

    @property
    def time(self) -> float: ...
    @property
    def kind(self) -> KindLike: ...
    @property
    def job(self) -> str: ...
    @property
    def detail(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class PoolSeries:
    """GPUs of one pool by state over time.

    Attributes:
        pool: ``"training"`` or ``"inference"`` (or another pool name the store holds).
        gpus: GPUs in the pool (the counts of every point sum to it).
        times: Change points (s), increasing; the first is 0.
        counts: State (one of :data:`GPU_STATES`) -> its count at each point.
    """

    pool: str
    gpus: int
    times: tuple[float, ...]
    counts: Mapping[str, tuple[int, ...]]

    def at(self, t: float) -> dict[str, int]:
        """Count of each state at time ``t`` (before the first point: all idle)."""
        i = bisect_right(self.times, t) - 1
        if i < 0:
            return {s: (self.gpus if s == IDLE else 0) for s in GPU_STATES}
        return {s: self.counts[s][i] for s in GPU_STATES}


@dataclass(frozen=True, slots=True)
class JobSeries:
    """One training job's workers over time.

    Attributes:
        name: The job.
        times: Change points (s), increasing; the first is its submission.
        workers: Workers running from each point: the size of its latest formed
            generation (``started``/``resized`` are logged once the workers formed
            it, so a resize shows when the job resumed, not when it was decided), 0
            when preempted or ended.
        reclaims: Times its lent GPUs were reclaimed for inference.
        ahead: Those of ``reclaims`` that were proactive (the SLO guard's, ahead
            of demand: the log's ``proactive``).
        ended: ``"finished"``, ``"failed"``, ``"cancelled"``, or ``""`` (still
            running, or queued, when the log ends).
        held: GPUs bound or lent to it from each point (the ``gpu`` entries, logged
            when decided): above ``workers`` while its workers start or join, so a
            job is seen starting before its first generation forms (empty: not
            known, an old caller).
    """

    name: str
    times: tuple[float, ...]
    workers: tuple[int, ...]
    reclaims: tuple[float, ...] = ()
    ended: str = ""
    ahead: tuple[float, ...] = ()
    held: tuple[int, ...] = ()

    def starting(self) -> tuple[int, ...]:
        """At each point, GPUs held by the job that no formed worker runs on yet."""
        if not self.held:
            return tuple(0 for _ in self.workers)
        return tuple(max(0, h - w) for h, w in zip(self.held, self.workers, strict=True))

    def at(self, t: float) -> int:
        """Workers at time ``t`` (0 before its submission)."""
        i = bisect_right(self.times, t) - 1
        return self.workers[i] if i >= 0 else 0


@dataclass(frozen=True, slots=True)
class Timeline:
    """A run's timeline (see the module docstring for the clock and what it shows).

    Attributes:
        start: Unix time of second 0 (the controller's first start).
        end: Seconds of the last log entry (>= 0).
        pools: One series per pool, training first, then inference, then others.
        jobs: One series per job, in order of submission.
        replica_starts: Times of the replicas' cold starts.
        notes: Caveats found while reading (a pruned log, GPUs of no known pool).
    """

    start: float
    end: float
    pools: tuple[PoolSeries, ...]
    jobs: tuple[JobSeries, ...]
    replica_starts: tuple[float, ...] = ()
    notes: tuple[str, ...] = ()

    def pool(self, name: str) -> PoolSeries | None:
        """The series of pool ``name``, or None when the run has no such pool."""
        return next((p for p in self.pools if p.pool == name), None)


@dataclass
class _Gpu:
    job: str = ""
    replica: bool = False
    down: bool = False

    @property
    def state(self) -> str:
        # A job's worker wins over a replica: a lend evicts the replica first (and
        # logs it), so both flags set means an eviction the log did not record.
        if self.down:
            return DOWN
        if self.job:
            return JOB
        return REPLICA if self.replica else IDLE


@dataclass
class _Steps:
    """A step series being built: appends at one instant overwrite each other."""

    times: list[float] = field(default_factory=list)
    values: list[tuple[int, ...]] = field(default_factory=list)

    def put(self, t: float, value: tuple[int, ...]) -> None:
        if self.times and self.times[-1] == t:
            self.values[-1] = value
            if len(self.values) > 1 and self.values[-2] == value:
                # The instant's entries cancelled out (a GPU released and bound
                # again): no change to show.
                self.times.pop()
                self.values.pop()
        elif not self.values or self.values[-1] != value:
            self.times.append(t)
            self.values.append(value)


def controller_start(events: Sequence[EventLike]) -> float | None:
    """Unix time of the log's first ``controller_started`` entry (None: none kept)."""
    return next((e.time for e in events if e.kind.value == CONTROLLER_STARTED), None)


def build_timeline(events: Sequence[EventLike], pools: Mapping[str, str]) -> Timeline:
    """Rebuild a run's timeline from its event log.

    Args:
        events: The log in ``seq`` order (:meth:`JobStore.events`).
        pools: GPU id ("node.index") -> its pool, for every GPU of the cluster (the
            store's ``gpus`` table, or ``cluster.json``): GPUs no entry names are
            idle all along. A GPU the log names but ``pools`` does not is placed
            by its first use (``lend`` or a replica: inference; else training), and
            a note says so.

    Returns:
        The timeline; second 0 is the first ``controller_started`` entry, or the
        oldest entry when none is kept (a note says so). An empty log gives empty
        series starting at Unix time 0.
    """
    notes: list[str] = []
    start = controller_start(events)
    if start is None:
        start = events[0].time if events else 0.0
        if events:
            notes.append("no controller_started entry (pruned log?): time 0 is the oldest entry")
    pool_of = dict(pools)
    guessed = sorted(_place_unknown(events, pool_of))
    if guessed:
        notes.append(f"GPUs of no known pool, placed by their first use: {', '.join(guessed)}")
    gpus = {g: _Gpu() for g in pool_of}
    order = _pool_order(pool_of.values())
    steps = {p: _Steps() for p in order}
    jobs: dict[str, _Steps] = {}
    reclaims: dict[str, list[float]] = {}
    ahead: dict[str, list[float]] = {}
    ended: dict[str, str] = {}
    replica_starts: list[float] = []

    formed: dict[str, int] = {}  # each job's workers of its latest formed generation
    holding: dict[str, int] = {}  # GPUs bound or lent to it

    def job_steps(name: str) -> _Steps:
        return jobs.setdefault(name, _Steps())

    def put_job(name: str, t: float) -> None:
        job_steps(name).put(t, (formed.get(name, 0), holding.get(name, 0)))

    for p in order:
        steps[p].put(0.0, _counts(gpus, pool_of, p))
    end = 0.0
    for e in events:
        # Entries before the first start (a reconcile) are taken as at second 0.
        t = max(e.time - start, 0.0)
        end = max(end, t)
        d = e.detail
        kind = e.kind.value
        touched: list[str] = []
        if kind == GPU:
            g = gpus[d["gpu"]]
            op = d.get("op")
            if op in ("bind", "lend"):
                g.job, g.replica = e.job or "?", False
                if e.job:
                    holding[e.job] = holding.get(e.job, 0) + 1
                    put_job(e.job, t)
            elif op in ("release", "reclaim"):
                g.job = ""
                if e.job and e.job in holding:
                    holding[e.job] = max(0, holding[e.job] - 1)
                    put_job(e.job, t)
                if op == "reclaim" and e.job:
                    reclaims.setdefault(e.job, []).append(t)
                    if d.get("proactive"):
                        ahead.setdefault(e.job, []).append(t)
            touched.append(d["gpu"])
        elif kind == REPLICA_KIND and d.get("gpu") in gpus:
            op = d.get("op")
            if op == "start":
                gpus[d["gpu"]].replica = True
                replica_starts.append(t)
            elif op in ("evict", "died"):
                gpus[d["gpu"]].replica = False
            touched.append(d["gpu"])
        elif kind == NODE:
            for name in d.get("gpus", []):
                if name in gpus:
                    gpus[name] = _Gpu(down=d.get("op") == "left")
                    touched.append(name)
        elif kind in (SUBMITTED, PREEMPTED) and e.job:
            formed[e.job] = 0
            put_job(e.job, t)
        elif kind == STARTED and e.job:
            formed[e.job] = len(d.get("workers", []))
            put_job(e.job, t)
        elif kind == RESIZED and e.job:
            formed[e.job] = len(d.get("to", []))
            put_job(e.job, t)
        elif kind in ENDED and e.job:
            formed[e.job] = holding[e.job] = 0
            put_job(e.job, t)
            ended[e.job] = kind
        for p in dict.fromkeys(pool_of[name] for name in touched):
            steps[p].put(t, _counts(gpus, pool_of, p))
    return Timeline(
        start=start,
        end=end,
        pools=tuple(
            PoolSeries(
                pool=p,
                gpus=sum(1 for q in pool_of.values() if q == p),
                times=tuple(steps[p].times),
                counts={s: tuple(v[i] for v in steps[p].values) for i, s in enumerate(GPU_STATES)},
            )
            for p in order
        ),
        jobs=tuple(
            JobSeries(
                name=name,
                times=tuple(s.times),
                workers=tuple(v[0] for v in s.values),
                reclaims=tuple(reclaims.get(name, ())),
                ahead=tuple(ahead.get(name, ())),
                ended=ended.get(name, ""),
                held=tuple(v[1] for v in s.values),
            )
            for name, s in jobs.items()
        ),
        replica_starts=tuple(replica_starts),
        notes=tuple(notes),
    )


def _place_unknown(events: Iterable[EventLike], pool_of: dict[str, str]) -> set[str]:
    """Add the GPUs the log names but ``pool_of`` lacks (by first use); their ids."""
    added: set[str] = set()
    for e in events:
        kind = e.kind.value
        gpu = e.detail.get("gpu") if kind in (GPU, REPLICA_KIND) else None
        if not isinstance(gpu, str) or gpu in pool_of:
            continue
        lent = kind == REPLICA_KIND or e.detail.get("op") in ("lend", "reclaim")
        pool_of[gpu] = INFERENCE_POOL if lent else TRAINING_POOL
        added.add(gpu)
    return added


def _pool_order(pools: Iterable[str]) -> list[str]:
    known = [TRAINING_POOL, INFERENCE_POOL]
    present = set(pools)
    return [p for p in known if p in present] + sorted(present - set(known))


def _counts(gpus: Mapping[str, _Gpu], pool_of: Mapping[str, str], pool: str) -> tuple[int, ...]:
    states = [g.state for name, g in gpus.items() if pool_of[name] == pool]
    return tuple(states.count(s) for s in GPU_STATES)


# -- the requests CSV ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Requests:
    """A ``deepboot load`` requests CSV on a timeline's clock.

    Attributes:
        metric: The column plotted: ``"wait_s"`` (the router's queueing wait) when
            the CSV has it, else ``"latency_s"``.
        offset: Seconds added to ``send_s`` to put it on the timeline's clock.
        send: Send time of every sent request (s, timeline clock).
        value: Its ``metric`` in seconds; NaN when unknown (no answer, no header).
        ok: Whether it was answered 200.
    """

    metric: str
    offset: float
    send: tuple[float, ...]
    value: tuple[float, ...]
    ok: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One sent request of the CSV: ``send_s`` (load clock), metric value (NaN when
    unknown), HTTP status (0: none), and the Unix time it was sent (None: a CSV
    from before ``sent_at``)."""

    send_s: float
    value: float
    status: int
    sent_at: float | None = None


def read_requests(path: str | Path) -> tuple[str, list[RequestRow]]:
    """Read a ``deepboot load`` requests CSV.

    Rows never sent (empty ``send_s``) are left out.

    Returns:
        (the metric: ``"wait_s"`` if the CSV has that column, else ``"latency_s"``,
        the sent requests in file order).

    Raises:
        ConfigError: the file cannot be read, or lacks ``send_s``, ``status`` or the
            metric's column, or holds a value that is not a number.
    """
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            columns = reader.fieldnames or []
            metric = "wait_s" if "wait_s" in columns else "latency_s"
            missing = [c for c in ("send_s", "status", metric) if c not in columns]
            if missing:
                raise ConfigError(
                    f"{path}: not a 'deepboot load' requests CSV (no {', '.join(missing)} column)"
                )
            rows = []
            for n, r in enumerate(reader, start=2):
                if not r["send_s"]:
                    continue
                try:
                    value = float(r[metric]) if r[metric] else math.nan
                    sent_at = float(r["sent_at"]) if r.get("sent_at") else None
                    rows.append(
                        RequestRow(float(r["send_s"]), value, int(r["status"] or 0), sent_at)
                    )
                except ValueError:
                    raise ConfigError(f"{path}, line {n}: not a number in {r!r}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read requests CSV {path}: {exc.strerror or exc}") from None
    return metric, rows


def sent_offset(rows: Sequence[RequestRow], start: float) -> float | None:
    """Seconds to add to a load's ``send_s`` to put it on the log's clock (second 0
    at Unix time ``start``), from the rows' own Unix send times (``sent_at``, in
    every CSV of a recent ``deepboot load``); None when the CSV has none.

    A request's ``sent_at - send_s`` is the Unix time of the load's second 0; the
    smallest is taken (a row whose Unix time was read a little late only adds)."""
    zeros = [r.sent_at - r.send_s for r in rows if r.sent_at is not None]
    return min(zeros) - start if zeros else None


def load_offset(
    events: Sequence[EventLike], start: float, first_send_s: float, after: float | None = None
) -> float:
    """Seconds to add to a load's ``send_s`` to put it on the log's clock.

    The load's clock starts when it begins sending, and its first request starts the
    service's first replica (a cold start, logged): that ``replica start`` entry is
    taken as the first request's send time. A replica pre-warmed with no request
    (``prewarm``, ``--slo``) is not one: its start is skipped.

    Args:
        events: The event log.
        start: Unix time of the log's second 0.
        first_send_s: The smallest ``send_s`` of the load.
        after: Unix time the load started, when known: the first ``start`` at or
            after it is used (and it is itself used when there is none). None: the
            log's first replica ``start`` (second 0 when there is none).
    """
    floor = -math.inf if after is None else after
    first = next(
        (
            e.time
            for e in events
            if e.kind.value == REPLICA_KIND
            and e.detail.get("op") == "start"
            and not e.detail.get("prewarm")  # started by no request (--slo)
            and e.time >= floor
        ),
        start if after is None else after,
    )
    return first - start - first_send_s


def align_requests(metric: str, rows: Sequence[RequestRow], offset: float) -> Requests:
    """The rows on the timeline's clock: ``send_s + offset``, in send order."""
    ordered = sorted(rows, key=lambda r: r.send_s)
    return Requests(
        metric=metric,
        offset=offset,
        send=tuple(r.send_s + offset for r in ordered),
        value=tuple(r.value for r in ordered),
        ok=tuple(r.status == 200 for r in ordered),
    )
