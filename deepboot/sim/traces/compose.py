"""A training workload plus inference streams, time-aligned and scaled to a target peak
busy fraction of the inference pool: one DeepBoot workload and one services file.

**Inputs**: the training workload is any Pollux or DeepBoot CSV (``from-philly``'s
output too); its training rows are kept as they are (name, time, application,
replicas, batch size) and its inference rows (``application`` starting with
``infer-``) are dropped and counted: the streams replace them. Each inference stream is
a DeepBoot CSV whose rows all name a service of its services file
(``application = infer-<service>``), such as ``from-genai`` and ``from-azure-llm``
write. Service names must not clash between streams.

**Alignment**: each stream is shifted so that its first request arrives with the
training workload's first job (``T0``); gaps inside a stream are kept.

**Busy fraction** (see :mod:`deepboot.sim.traces.common`): windows of ``window_s``
seconds (10 minutes by default) from ``T0`` up to the end of the last request; a
request's ``duration x gpus_per_replica / concurrency`` GPU-seconds go to the windows
its run overlaps,
in proportion to the overlap. A window's busy fraction is its GPU-seconds over
``window_s x inference GPUs``; the **peak** is the largest window's, the **average**
every window's GPU-seconds over their capacity together.

**Scaling** to a target peak (seeded): every request ``i`` draws ``u_i`` uniform in
[0, 1); at scale ``s`` it appears ``ceil(s - u_i)`` times (at least 0): ``s < 1`` thins
(a request is kept with probability ``s``), ``s > 1`` replicates (``floor(s)`` or
``floor(s) + 1`` copies, ``s`` on average). The original keeps its arrival; copy ``k >=
1`` arrives later by ``gap x frac(w_i + k x 0.618...)`` (``w_i`` a second uniform draw,
``gap`` the stream's mean gap between arrivals): the copies of a request are spread
evenly over that gap, so that replicated load looks like a denser arrival process of
the same shape rather than synchronised duplicates. The draws are fixed before ``s`` is
searched, so the peak only grows with ``s``; ``s`` is found by bisection (until one
request apart) and the achieved peak is the closest the requests' granularity allows.
Without a target, ``s = 1``: the streams are only aligned and merged.

Valid rows: as :func:`deepboot.sim.workload.load_workload` reads them, with training
``num_replicas`` in [1, 4096] and ``batch_size`` >= 1 (the model's own limits are
checked when the workload is simulated) and inference ``duration`` in (0, 1e9] s.
Every error is an :class:`~deepboot.core.errors.InputError` naming the file, the line
and the column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepboot.core.errors import ConfigError, InputError
from deepboot.core.service import ServiceSpec
from deepboot.sim.traces.common import (
    MAX_TIME_S,
    SOURCE_PREFIX,
    Busy,
    Request,
    format_seconds,
    read_rows,
    request_rows,
    window_gpu_seconds,
)
from deepboot.sim.workload import DEEPBOOT_COLUMNS, MAX_REPLICAS, POLLUX_COLUMNS

MAX_BATCH = 1_000_000_000
"""Largest training ``batch_size`` accepted here."""
BISECTION_STEPS = 60
GOLDEN = (math.sqrt(5) - 1) / 2
"""Step of the copies' delays (a Weyl sequence: the most even spread)."""


@dataclass(frozen=True, slots=True)
class TrainingRow:
    """A training job, as its row gives it."""

    line: int
    name: str
    time: float
    application: str
    num_replicas: int
    batch_size: int


@dataclass(frozen=True, slots=True)
class TrainingFile:
    """The training rows of a workload and how many inference rows it also had."""

    path: str
    rows: tuple[TrainingRow, ...]
    inference_rows: int


def read_training(path: str | Path) -> TrainingFile:
    """Read the training rows of a Pollux or DeepBoot workload (the file is streamed).

    Raises:
        InputError: a bad row (naming the file, the line and the column), a name used
            twice, or no training row at all.
    """
    spath = str(path)
    rows: list[TrainingRow] = []
    seen: dict[str, int] = {}
    dropped = 0
    for row in read_rows(path, "a Pollux or DeepBoot workload CSV", POLLUX_COLUMNS):
        application = row.text("application")
        if application.startswith("infer-"):
            dropped += 1
            continue
        name = row.text("name")
        if not name:
            raise row.error("name", "is empty")
        if name in seen:
            raise row.error("name", f"duplicate job name {name!r} (first on line {seen[name]})")
        seen[name] = row.line
        if not application:
            raise row.error("application", "is empty")
        replicas = row.count("num_replicas", MAX_REPLICAS)
        batch = row.count("batch_size", MAX_BATCH)
        for column, value in (("num_replicas", replicas), ("batch_size", batch)):
            if value < 1:
                raise row.error(column, "must be at least 1")
        time = row.number("time", MAX_TIME_S)
        rows.append(TrainingRow(row.line, name, time, application, replicas, batch))
    if not rows:
        raise InputError(spath, 0, "application", "the workload has no training rows")
    rows.sort(key=lambda r: r.time)
    return TrainingFile(spath, tuple(rows), dropped)


@dataclass(frozen=True, slots=True)
class Stream:
    """One inference stream: its requests, its services and its services file's header.

    Attributes:
        source: The workload file (for messages).
        services_source: The services file (for messages).
        requests: Sorted by arrival.
        services: Every service of the services file.
        notes: The services file's header comment lines.
    """

    source: str
    services_source: str
    requests: tuple[Request, ...]
    services: tuple[ServiceSpec, ...]
    notes: tuple[str, ...]


def read_stream(
    path: str | Path,
    services: Sequence[ServiceSpec],
    services_path: str | Path,
    notes: tuple[str, ...] | None = None,
) -> Stream:
    """Read an inference stream: a DeepBoot CSV whose every row names one of
    ``services`` (read from ``services_path``, whose header comments are kept:
    ``notes``, or read from the file when None).

    Raises:
        InputError: a bad row, a row that is not an inference row of one of the
            services, naming the file, the line and the column.
    """
    by_name = {s.name: s for s in services}
    requests: list[Request] = []
    for row in read_rows(path, "a DeepBoot workload CSV", DEEPBOOT_COLUMNS):
        application = row.text("application")
        service = application.removeprefix("infer-")
        if service == application or service not in by_name:
            raise row.error(
                "application", f"{application[:80]!r} is not infer-<service> of a service "
                f"of {services_path}",
            )  # fmt: skip
        for column in ("num_replicas", "batch_size"):
            if row.text(column) != "1":
                raise row.error(column, "must be 1 for an inference row")
        time = row.number("time", MAX_TIME_S)
        duration = row.number("duration", MAX_TIME_S, low_open=True)
        requests.append(Request(time, service, duration))
    requests.sort(key=lambda r: r.time)
    if notes is None:
        notes = header_comments(services_path)
    return Stream(str(path), str(services_path), tuple(requests), tuple(services), notes)


def header_comments(path: str | Path) -> tuple[str, ...]:
    """The comment lines at the top of a text file, without their ``#``.

    Raises:
        InputError: the file cannot be read.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise InputError(str(path), 0, "", "cannot read the services file") from None
    return comments_of(text)


def comments_of(text: str) -> tuple[str, ...]:
    """The comment lines at the top of ``text``, without their ``#``."""
    out: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.lstrip().startswith("#"):
            break
        out.append(line.lstrip()[1:].strip())
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ComposeConfig:
    """Knobs of :func:`compose`.

    Attributes:
        inference_gpus: GPUs of the inference pool (>= 1).
        peak_busy: Target peak busy fraction, in (0, 4]; None: no scaling.
        window_s: Window length in seconds, in [1, 86400].
        max_requests: Most inference requests written (>= 1).
    """

    inference_gpus: int
    peak_busy: float | None = None
    window_s: float = 600.0
    max_requests: int = 1_000_000

    def __post_init__(self) -> None:
        if self.inference_gpus < 1:
            raise ConfigError("compose needs an inference pool of at least one GPU")
        if self.peak_busy is not None and not 0 < self.peak_busy <= 4:
            raise ConfigError(f"peak busy fraction must be in (0, 4], got {self.peak_busy}")
        if not 1 <= self.window_s <= 86_400:
            raise ConfigError(f"window must be in [1, 86400] s, got {self.window_s}")
        if self.max_requests < 1:
            raise ConfigError(f"max requests must be >= 1, got {self.max_requests}")


@dataclass(frozen=True, slots=True)
class Composition:
    """What :func:`compose` produces.

    Attributes:
        rows: The workload's rows (DeepBoot columns), sorted by time, training first
            at equal times.
        services: Every stream's services, in stream order.
        notes: Lines for the services file's header: the credits first.
        summary: One line: jobs, requests, scale, achieved busy fractions, credits.
        scale: The scale ``s`` used.
        busy: The achieved busy fractions.
    """

    rows: tuple[tuple[str, ...], ...]
    services: tuple[ServiceSpec, ...]
    notes: tuple[str, ...]
    summary: str
    scale: float
    busy: Busy


class _Pool:
    """The merged requests and their fixed random draws (see the module doc).

    Arrays of shape (n,), one entry per request: ``times`` (aligned arrivals),
    ``durations``, ``shares`` (1 / concurrency), ``spread`` (the stream's mean gap);
    ``u`` and ``w`` are the request's two uniform draws.
    """

    def __init__(
        self,
        times: np.ndarray,
        durations: np.ndarray,
        shares: np.ndarray,
        spread: np.ndarray,
        origin: float,
        config: ComposeConfig,
        rng: np.random.Generator,
    ) -> None:
        self.times, self.durations, self.shares, self.spread = times, durations, shares, spread
        self.origin, self.config = origin, config
        n = len(times)
        scaled = config.peak_busy is not None
        self.u = rng.random(n) if scaled else np.zeros(n)
        self.w = rng.random(n) if scaled else np.zeros(n)
        self.peaks: dict[float, float] = {}

    def counts(self, s: float) -> np.ndarray:
        """Copies of each request at scale ``s``: ``ceil(s - u)``, at least 0."""
        counts: np.ndarray = np.maximum(np.ceil(s - self.u), 0).astype(np.int64)
        return counts

    def count(self, s: float) -> int:
        return int(self.counts(s).sum())

    def copies(self, s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(request index, copy number, arrival) of every copy at scale ``s``."""
        counts = self.counts(s)
        index = np.repeat(np.arange(len(counts)), counts)
        first = np.cumsum(counts) - counts
        level = np.arange(len(index)) - np.repeat(first, counts)
        # Copy k >= 1 is delayed by spread x frac(w + k x GOLDEN): evenly spread over the
        # stream's mean gap, the same whatever s (so the peak only grows with s).
        delay = np.where(level > 0, np.mod(self.w[index] + level * GOLDEN, 1.0), 0.0)
        arrivals: np.ndarray = self.times[index] + delay * self.spread[index]
        return index, level, arrivals

    def busy(self, s: float) -> Busy:
        index, _, arrivals = self.copies(s)
        gpu_s = window_gpu_seconds(
            arrivals,
            self.durations[index],
            self.shares[index],
            self.origin,
            self.config.window_s,
        )
        return Busy.of(gpu_s, self.config.window_s, self.config.inference_gpus)

    def peak(self, s: float) -> float:
        if s not in self.peaks:
            if self.count(s) > 4 * self.config.max_requests:
                raise ConfigError(
                    f"the target peak busy fraction needs more than "
                    f"{self.config.max_requests:,} inference requests (--max-requests)"
                )
            self.peaks[s] = self.busy(s).peak
        return self.peaks[s]

    def scale_for(self, target: float) -> float:
        """The ``s`` whose peak is closest to ``target`` (ties: the smaller): bisection
        until the two ends differ by one request or :data:`BISECTION_STEPS` steps."""
        lo, hi = 0.0, 1.0
        if self.peak(1.0) < target:
            lo, hi = 1.0, max(2.0, 1.25 * target / self.peak(1.0))
            while self.peak(hi) < target:
                lo, hi = hi, 2 * hi
        for _ in range(BISECTION_STEPS):
            if self.count(hi) - self.count(lo) <= 1:
                break
            mid = (lo + hi) / 2
            if self.peak(mid) < target:
                lo = mid
            else:
                hi = mid
        return lo if target - self.peak(lo) <= self.peak(hi) - target else hi


def compose(
    training: TrainingFile,
    streams: Sequence[Stream],
    config: ComposeConfig,
    rng: np.random.Generator,
) -> Composition:
    """Compose a training workload and inference streams (see the module doc).

    Args:
        training: From :func:`read_training`; never mutated.
        streams: From :func:`read_stream`, at least one; never mutated.
        config: Pool size, target and limits.
        rng: Draws the thinning/replication and the copies' delays (unused without a
            target peak).

    Raises:
        ConfigError: two streams share a service name, a stream is empty, the target
            needs more than ``max_requests`` requests, or an inference row's name
            clashes with a training job's.
    """
    if not streams:
        raise ConfigError("give at least one inference stream")
    _check_names(streams)
    origin = training.rows[0].time
    times, durations, shares, spread, services = [], [], [], [], []
    for stream in streams:
        if not stream.requests:
            raise ConfigError(f"{stream.source} has no inference rows")
        concurrency = {s.name: s.concurrency for s in stream.services}
        # A replica of k GPUs: a request holds k / concurrency GPUs (1.0 / c for k = 1).
        size = {s.name: float(s.gpus_per_replica) for s in stream.services}
        first, last = stream.requests[0].time, stream.requests[-1].time
        # The mean gap between arrivals (n - 1 gaps); a stream whose requests all
        # arrive at once spreads its copies over a window instead.
        gap = (last - first) / max(len(stream.requests) - 1, 1) or config.window_s
        for r in stream.requests:
            times.append(origin + r.time - first)
            durations.append(r.duration)
            shares.append(size[r.service] / concurrency[r.service])
            spread.append(gap)
            services.append(r.service)
    pool = _Pool(
        np.array(times), np.array(durations), np.array(shares), np.array(spread),
        origin, config, rng,
    )  # fmt: skip
    scale = 1.0 if config.peak_busy is None else pool.scale_for(config.peak_busy)
    if pool.count(scale) > config.max_requests:
        raise ConfigError(
            f"the scaled streams hold {pool.count(scale):,} requests, more than "
            f"--max-requests {config.max_requests:,}"
        )
    index, level, arrivals = pool.copies(scale)
    if len(arrivals) and float(arrivals.max()) > MAX_TIME_S:
        raise ConfigError(f"an inference request would arrive after {MAX_TIME_S:g} s")
    order = np.lexsort((level, index, arrivals))
    requests = [
        Request(float(arrivals[j]), services[int(index[j])], float(durations[int(index[j])]))
        for j in order.tolist()
    ]
    busy = pool.busy(scale)
    rows = _merge_rows(training, requests)
    specs = tuple(s for stream in streams for s in stream.services)
    credits = list(dict.fromkeys(n for st in streams for n in st.notes if _is_credit(n)))
    total_in = sum(len(st.requests) for st in streams)
    how = "unchanged" if scale == 1 else ("thinned" if scale < 1 else "replicated")
    target = "" if config.peak_busy is None else f" (target {config.peak_busy:g})"
    end_h = (busy.windows * config.window_s) / 3600
    notes = [
        *credits,
        f"Training: {training.path}: {len(training.rows)} jobs ({training.inference_rows} "
        "inference rows of it dropped).",
        *(
            f"Inference: {st.source} with {st.services_source}: {len(st.requests):,} "
            f"requests, first at {origin:g} s"
            for st in streams
        ),
        f"Scaled x{scale:.4f} ({how}, seeded) to {len(requests):,} requests: peak busy "
        f"{busy.peak:.3f}{target}, average {busy.mean:.3f} of {config.inference_gpus} "
        f"inference GPUs over {busy.windows} windows of {config.window_s:g} s.",
        *(f"{Path(st.services_source).name}: {n}" for st in streams for n in st.notes
          if not _is_credit(n)),
    ]  # fmt: skip
    summary = (
        f"compose: {len(training.rows)} training jobs ({training.inference_rows} inference "
        f"rows of the training file dropped), {len(streams)} inference stream(s), "
        f"{len(specs)} service(s), {total_in:,} -> {len(requests):,} requests (x{scale:.4f}, "
        f"{how}); inference from {origin:g} s over {end_h:.2f} h on "
        f"{config.inference_gpus} GPUs: peak busy {busy.peak:.3f}{target} in window "
        f"{busy.peak_window} ({busy.peak_window * config.window_s / 3600:.2f} h), average "
        f"{busy.mean:.3f} over {busy.windows} windows of {config.window_s:g} s"
        + "".join(f"; {c}" for c in credits)
    )
    return Composition(tuple(rows), specs, tuple(notes), summary, scale, busy)


def _is_credit(line: str) -> bool:
    return line.startswith(SOURCE_PREFIX)


def _check_names(streams: Sequence[Stream]) -> None:
    owner: dict[str, str] = {}
    for stream in streams:
        for spec in stream.services:
            if spec.name in owner:
                raise ConfigError(
                    f"service {spec.name!r} is in both {owner[spec.name]} and "
                    f"{stream.services_source}; service names must not clash (from-genai "
                    "--service-prefix, from-azure-llm --service)"
                )
            owner[spec.name] = stream.services_source


def _merge_rows(training: TrainingFile, requests: Sequence[Request]) -> list[tuple[str, ...]]:
    """Training rows and inference rows, by time (training first at equal times)."""
    names = {r.name for r in training.rows}
    infer = list(request_rows(requests))
    clash = next((row[0] for row in infer if row[0] in names), None)
    if clash is not None:
        raise ConfigError(f"inference row name {clash!r} is also a training job's name")
    train = [
        (r.name, format_seconds(r.time, 3), r.application, str(r.num_replicas),
         str(r.batch_size), "-1", "-1")
        for r in training.rows
    ]  # fmt: skip
    keyed: list[tuple[float, int, int, tuple[str, ...]]] = [
        (r.time, 0, i, row) for i, (r, row) in enumerate(zip(training.rows, train, strict=True))
    ]
    keyed += [(q.time, 1, i, row) for i, (q, row) in enumerate(zip(requests, infer, strict=True))]
    keyed.sort(key=lambda k: (k[0], k[1], k[2]))
    return [k[3] for k in keyed]
