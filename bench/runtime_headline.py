"""The testbed headline: a GenAI day on the local runtime, without lending, with
reactive ``deepboot`` and with ``deepboot --slo``, and the simulator's prediction of
each run beside it (issue 24).

**The workload.** The GenAI day of ``examples/genai-day.csv`` (the busiest 24 hours
of the Alibaba GenAI trace compressed to 8 hours: busy at the start, a near-silent
trough from about a third of the day to 70%, a ramp, busy again at the end), thinned
to one request in :data:`THIN` (244 requests: the file was scaled to a peak busy
fraction of 0.5 of its 32 inference GPUs, and one in 16 keeps that fraction on our
2) and replayed with ``deepboot load --trace --time-scale K`` so that the day lasts
``--minutes`` (K = 28800 / (60 x minutes): 48 at the default 10 minutes; each
request's execution time is the trace's / K). The trace replay rather than a rate
profile: it keeps the trace's bursts and per-request execution times, which the
simulator then replays request by request. All its services are sent to one,
``chat`` (``examples/runtime/echo_service.py``, at most 2 replicas, one request at a
time each): a new replica loads for :data:`LOAD_S` seconds (an artificial cold
start; 12-17 s in all with the process start on 2 cores), and its SLO is a
:data:`SLO_WAIT_S` s wait (target 0.99), below the cold start, so only a replica
already loaded meets it (the pre-warm regime ``--slo`` is for). Before the day the
service is warmed up by the day's last 5% (:data:`WARMUP`, the previous day's busy
end, ~30 s at 10 minutes), so the day starts as after another one: replicas loaded,
the SLO guard's forecast with history; those requests are replayed in the simulator
too, and counted in neither world. Four elastic jobs of fixed work
(``bench/twin_job.py``: 1-4 workers, a fixed total batch of 48, 20 ms of simulated
GPU time a sample) are submitted over the first sixth of the day (:data:`JOBS`;
their steps scale with ``--minutes``); they need more than the training pool's 2
GPUs. The cluster: 1 training + 1 inference node x 2 logical GPUs, policy
``deepboot`` (restart_delay=2), 2 s rounds, protect factor 0.1, AFE. Each
configuration runs until every job has finished and the day's load has ended.

**Three configurations**, one runtime run each: ``deepboot up --no-lending`` (the
training pool only: the baseline), ``deepboot up`` (reactive DeepBoot: idle
inference GPUs lent, taken back when a request needs one) and ``deepboot up --slo``
(SLO-guarded lending: hold and pre-warm what the forecast needs, lend the rest).

**Measured** (runtime): the average JCT of the four jobs; SLO attainment (the day's
requests whose wait, the router's ``X-Wait-Ms``, was at most the SLO, over all sent;
a request with no answer missed); the p99 wait of the answered; the reclaims
(proactive: the SLO guard took the GPU back ahead of demand; reactive: a waiting
request did); the GPU-seconds lent. **Predicted** (simulator): the same three runs in
the simulator, as ``bench/twin.py`` does it (the same jobs, submit times and
requests; each job's step times, the pauses of its resizes, the cold start and each
request's service time from that runtime run's own measurements; the same cluster,
policy, interval, protect factor and ``--no-lending`` / ``--slo`` switch), and the
ratio of its average JCT to the measured one.

    PYTHONPATH=. .venv/bin/python bench/runtime_headline.py               # 3 x ~10.5 min
    PYTHONPATH=. .venv/bin/python bench/runtime_headline.py --minutes 2   # 3 x ~2.7 min
    PYTHONPATH=. .venv/bin/python bench/runtime_headline.py --keep K --out h.json
    PYTHONPATH=. .venv/bin/python bench/runtime_headline.py --resim K     # seconds
    PYTHONPATH=. .venv/bin/python bench/runtime_headline.py --configs slo --minutes 2
    PYTHONPATH=. .venv/bin/python bench/runtime_headline.py --guaranteed 1

``--guaranteed N`` gives the service ``guaranteed_replicas = N`` in every
configuration (both worlds): N replicas stay loaded whatever the load, as a service
with a minimum replica count runs. Without it (0), ``--slo`` holds what its forecast
asks for, which after a silence longer than the forecast's memory (8 half-lives, 80
s here; the day's trough has one of about 3 minutes, 2.4 hours of the trace) is
nothing: the first request after it waits for a cold start.

``--keep K`` keeps each configuration's state directory, requests CSVs and inputs in
``K/<configuration>``; ``--resim K`` re-reads them and re-simulates (seconds, no
cluster). The 2-minute day is for development: its trough (~40 s) is shorter than
the SLO guard's forecast takes to decay (its half-life is 5 rounds, 10 s), so there
``--slo`` lends almost nothing. The runtime runs on a shared 2-core machine: its
numbers are one run each, and noisy.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from twin import (  # noqa: E402
    EXAMPLES,
    REPO,
    MeasuredRestart,
    Setup,
    WorldRun,
    _as_dict,
    _median,
    _read,
    _resim,
    _service_time,
    runtime_session,
    simulate,
    write_jobs,
)

from deepboot.runtime.store.jobstore import EventRow, LogKind  # noqa: E402

# -- the workload ----------------------------------------------------------------------

TRACE = REPO / "examples" / "genai-day.csv"
"""The GenAI day (its inference rows are the load; its training rows are not used)."""
SERVICES = REPO / "examples" / "genai-day.toml"
"""Its services (the trace's rows name them); every one is sent to :data:`SERVICE`."""
DAY_TRACE_S = 8 * 3600.0
"""The trace's day: 24 hours compressed to 8 (rows after it are dropped)."""
THIN = 16
"""Replay one inference row in THIN (every THIN-th, in time order)."""
WARMUP = 0.05
"""Before the day, the service is warmed up by the day's last WARMUP (its busy end,
the previous day's, replayed to its last answer): the day starts as it would after
another one, with replicas loaded and a forecast with history, instead of a cold
service that every configuration (and the lending ones after a reclaim) must load
under the day's busiest start."""
MINUTES = 10.0
"""Default length of the replayed day, minutes."""
SERVICE = "chat"
LOAD_S = 10.0
"""The echo handler's artificial load: seconds a new replica sleeps before serving."""
SLO_WAIT_S = 3.0
"""The service's SLO: most seconds a request may wait for a ready replica."""
SLO_TARGET = 0.99
JOBS: tuple[tuple[str, float, int], ...] = (
    ("j1", 0.00, 150),
    ("j2", 0.05, 200),
    ("j3", 0.10, 250),
    ("j4", 0.15, 300),
)
"""(name, submit time as a fraction of the day, steps at the default 10 minutes) of
each job; their steps scale with ``--minutes`` (at least one simulated epoch)."""
BASE = Setup(
    jobs=(),
    training_nodes=1,
    inference_nodes=1,
    gpus_per_node=2,
    interval=2.0,
    protect_factor=0.1,
    policy="deepboot",
    policy_params=(("restart_delay", 2),),
    service=SERVICE,
    slo_wait_s=SLO_WAIT_S,
    requests_until_done=False,
)
"""The cluster, policy and service of every configuration (jobs: per ``--minutes``)."""
CONFIGS: dict[str, tuple[bool, bool]] = {
    "no-lending": (False, False),
    "reactive": (True, False),
    "slo": (True, True),
}
"""Each configuration's (lending, slo): ``deepboot up --no-lending``, plain, ``--slo``."""
LABELS = {"no-lending": "no lending", "reactive": "reactive deepboot", "slo": "deepboot --slo"}


def setup_for(config: str, minutes: float, guaranteed: int = 0) -> Setup:
    """The :class:`~twin.Setup` of ``config`` for a day of ``minutes``, the service
    holding ``guaranteed`` replicas whatever the load (``guaranteed_replicas``)."""
    day = minutes * 60.0
    jobs = tuple((name, frac * day, steps) for name, frac, steps in JOBS)
    lending, slo = CONFIGS[config]
    return replace(BASE, jobs=jobs, lending=lending, slo=slo, guaranteed_replicas=guaranteed)


def work_scale(minutes: float) -> float:
    """The jobs' steps multiplier: 1 at the default day."""
    return minutes / MINUTES


def time_scale(minutes: float) -> float:
    """``deepboot load --time-scale``: trace seconds per second of the replay."""
    return DAY_TRACE_S / (minutes * 60.0)


def thin_trace(rows: Iterable[Mapping[str, str]], every: int, day_s: float) -> list[dict[str, str]]:
    """Every ``every``-th inference row (``application`` infer-...) of a DeepBoot
    workload before trace second ``day_s``, in time order (ties: file order)."""
    infer = [
        dict(r) for r in rows if r["application"].startswith("infer-") and float(r["time"]) < day_s
    ]
    infer.sort(key=lambda r: float(r["time"]))
    return infer[::every]


def write_inputs(work: Path, setup: Setup, minutes: float) -> tuple[Path, list[Path], Path]:
    """The service file, the job files and the thinned trace, in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    service = work / f"{SERVICE}.toml"
    service.write_text(
        f'name = "{SERVICE}"\nmodel = "tiny-mlp"\n'
        f'handler = "{EXAMPLES / "echo_service.py"}:load"\n'
        f"concurrency = 1\nmax_replicas = {setup.max_replicas}\nqueue_bound = 1000\n"
        f"request_timeout_s = 120\nslo_wait_s = {SLO_WAIT_S}\nslo_target = {SLO_TARGET}\n"
        f"guaranteed_replicas = {setup.guaranteed_replicas}\n"
        f"[args]\ndelay_s = 0.1\nload_s = {LOAD_S}\n"
    )
    jobs = write_jobs(work, setup, work_scale(minutes))
    with TRACE.open() as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        rows = thin_trace(reader, THIN, DAY_TRACE_S)
    trace = work / "day.csv"
    with trace.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return service, jobs, trace


def load_args(trace: Path, minutes: float, start: float | None = None) -> list[str]:
    """``deepboot load``'s arguments that replay ``trace`` as a day of ``minutes``
    (from trace second ``start`` on, if given)."""
    return [
        *([] if start is None else ["--start", f"{start:g}"]),
        "--trace", str(trace), "--services", str(SERVICES), "--time-scale",
        f"{time_scale(minutes):g}", "--service-map", f"*={SERVICE}", "--slo-wait",
        str(SLO_WAIT_S), "--timeout", "150",
    ]  # fmt: skip


# -- what each world measured ------------------------------------------------------------


@dataclass
class Side:
    """One world's figures of one configuration.

    Attributes:
        jct: Job -> JCT, seconds (finished jobs only).
        attainment: Requests that met the SLO over all requests (None: no request).
        attainment_warm: The same over the requests sent from the first one that met
            the SLO on (the day starts busy, with no replica loaded: the first cold
            start's misses, and its backlog's, are the same in every configuration).
        p99_wait_s: The 99th percentile of the known waits (None: none known).
        requests: Requests sent (simulator: replayed).
        unanswered: Requests with no known wait (runtime: no answer, or an error
            without the router's header; simulator: never started).
        reclaims_proactive: GPUs taken back from training ahead of demand.
        reclaims_reactive: GPUs taken back because a request waited.
        lent_gpu_s: GPU-seconds inference GPUs spent lent to training.
        prewarms: Replicas started with no request (``--slo``; runtime only).
        cold_starts: Replicas started during the day (runtime: every replica start,
            pre-warms included; simulator: the requests that waited for one).
    """

    jct: dict[str, float] = field(default_factory=dict)
    attainment: float | None = None
    attainment_warm: float | None = None
    p99_wait_s: float | None = None
    requests: int = 0
    unanswered: int = 0
    reclaims_proactive: int = 0
    reclaims_reactive: int = 0
    lent_gpu_s: float = 0.0
    prewarms: int = 0
    cold_starts: int = 0

    @property
    def avg_jct(self) -> float | None:
        return statistics.fmean(self.jct.values()) if self.jct else None

    @property
    def reclaims(self) -> str:
        return f"{self.reclaims_proactive}/{self.reclaims_reactive}"


def attainments(
    sends: Sequence[float], waits: Sequence[float | None]
) -> tuple[float | None, float | None]:
    """(attainment, attainment once warm) of requests sent at ``sends`` that waited
    ``waits`` (None: never handed to a replica, a miss); see :class:`Side`."""
    if not sends:
        return None, None
    met = [w is not None and w <= SLO_WAIT_S for w in waits]
    first = min((t for t, m in zip(sends, met, strict=True) if m), default=math.inf)
    later = [m for t, m in zip(sends, met, strict=True) if t >= first]
    return sum(met) / len(met), (sum(later) / len(later) if later else None)


def request_wait(row: Mapping[str, str]) -> float | None:
    """A request's wait for a ready replica, seconds: the router's ``wait_s``, else
    for a 200 its latency less its ``exec_s`` (an estimate, as ``deepboot load``'s),
    else None (no answer: it missed)."""
    if row.get("wait_s"):
        return float(row["wait_s"])
    if row.get("status") == "200" and row.get("latency_s"):
        return max(float(row["latency_s"]) - float(row.get("exec_s") or 0.0), 0.0)
    return None


def p99(values: Sequence[float]) -> float | None:
    """The 99th percentile (linear), None for no value (the simulator's ``p99``)."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), 99)) if values else None


def measured_side(
    rt: WorldRun,
    requests: Sequence[Mapping[str, str]],
    log: Sequence[EventRow],
    since: float = -math.inf,
) -> Side:
    """The runtime's figures: ``rt`` (:func:`twin._runtime_result`), the requests CSV's
    rows and the event log (its entries from Unix time ``since`` on: the day's)."""
    waits = [request_wait(r) for r in requests]
    known = [w for w in waits if w is not None]
    attained, warm = attainments([float(r["send_s"]) for r in requests], waits)
    side = Side(
        jct={j: v for j in rt.submit if (v := rt.jct(j)) is not None},
        attainment=attained,
        attainment_warm=warm,
        p99_wait_s=p99(known),
        requests=len(waits),
        unanswered=len(waits) - len(known),
        lent_gpu_s=rt.lent_gpu_s,
    )
    for e in log:
        if e.time < since:
            continue
        d = e.detail
        if e.kind is LogKind.GPU and d.get("op") == "reclaim":
            if d.get("proactive"):
                side.reclaims_proactive += 1
            else:
                side.reclaims_reactive += 1
        elif e.kind is LogKind.REPLICA and d.get("op") == "start":
            side.cold_starts += 1
            side.prewarms += bool(d.get("prewarm"))
    return side


def sim_side(run: WorldRun, sim: Any, skip: int = 0) -> Side:
    """The simulator's figures: ``run`` and the :class:`Simulation` it came from; the
    requests' figures leave out the first ``skip`` (the warm-up's)."""
    records = () if sim.serving is None else sim.serving.records()[skip:]
    delays = [r.delay for r in records if r.delay is not None]
    attained, warm = attainments([r.submit for r in records], [r.delay for r in records])
    reclaims = () if sim.serving is None else sim.serving.reclaim_times
    proactive = () if sim.serving is None else sim.serving.proactive_reclaim_times
    return Side(
        jct={j: v for j in run.submit if (v := run.jct(j)) is not None},
        attainment=attained,
        attainment_warm=warm,
        p99_wait_s=p99(delays),
        requests=len(records),
        unanswered=len(records) - len(delays),
        reclaims_proactive=len(proactive),
        reclaims_reactive=len(reclaims) - len(proactive),
        lent_gpu_s=run.lent_gpu_s,
        cold_starts=sum(1 for r in records if r.cold and r.start is not None),
    )


@dataclass
class Result:
    """One configuration: what the runtime measured and what the simulator predicted."""

    config: str
    measured: Side
    predicted: Side
    wall_s: float
    runtime: WorldRun
    sim: WorldRun

    @property
    def ratio(self) -> float | None:
        """Predicted over measured average JCT."""
        m, p = self.measured.avg_jct, self.predicted.avg_jct
        return None if m is None or p is None or not m else p / m


def _requests(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return [r for r in csv.DictReader(f) if r["send_s"]]


def evaluate(config: str, root: Path, rt: WorldRun, minutes: float, guaranteed: int = 0) -> Result:
    """The measured side of the run kept in ``root``, and its simulation."""
    _, log = _read(root / "state")
    warm = root / "warmup.csv"
    warmup = _requests(warm) if warm.exists() else []
    day = float((root / "load_started").read_text())
    requests = _requests(root / "requests.csv")
    return evaluate_run(config, rt, requests, log, minutes, warmup, day, guaranteed)


def evaluate_run(
    config: str,
    rt: WorldRun,
    requests: Sequence[Mapping[str, str]],
    log: Sequence[EventRow],
    minutes: float,
    warmup: Sequence[Mapping[str, str]] = (),
    day_start: float = -math.inf,
    guaranteed: int = 0,
) -> Result:
    """``rt`` with its requests CSV's rows and event log, and its simulation, which
    also replays the ``warmup`` requests' rows (their own figures are not counted in
    either world: they are before the day, which began at Unix time ``day_start``)."""
    measured = measured_side(rt, requests, log, day_start)
    t0 = next((e.time for e in log if e.kind is LogKind.CONTROLLER_STARTED), 0.0)
    before = warmup_requests(warmup, t0, rt.measured.service_s)
    rt.requests = sorted([*before, *rt.requests])
    sim_run, sim = simulate(rt, setup_for(config, minutes, guaranteed), work_scale(minutes))
    side = sim_side(sim_run, sim, skip=len(before))
    return Result(config, measured, side, rt.wall_s, rt, sim_run)


def warmup_requests(
    rows: Sequence[Mapping[str, str]], t0: float, default_s: float
) -> list[tuple[float, float]]:
    """(send time on the run's clock, service time) of each warm-up request: its
    Unix send time less ``t0`` (rows without one are left out), its latency less the
    router's wait (``default_s`` without them)."""
    return [
        (float(r["sent_at"]) - t0, _service_time(dict(r), default_s))
        for r in rows
        if r.get("sent_at")
    ]


# -- the report --------------------------------------------------------------------------


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def gain_kept(results: Mapping[str, Result]) -> float | None:
    """The share of reactive ``deepboot``'s JCT gain over no lending that ``--slo``
    keeps: (no-lending - slo) / (no-lending - reactive), measured; None without the
    three, or without a gain."""
    try:
        base, reactive, slo = (
            results[c].measured.avg_jct for c in ("no-lending", "reactive", "slo")
        )
    except KeyError:
        return None
    if base is None or reactive is None or slo is None or base <= reactive:
        return None
    return (base - slo) / (base - reactive)


COLUMNS = (
    "", "avg JCT (s)", "sim JCT (s)", "sim / meas.", "SLO attained", "sim", "p99 wait (s)",
    "sim", "reclaims", "sim", "lent GPU-s", "sim", "wall (s)",
)  # fmt: skip


def table(results: Mapping[str, Result], minutes: float, guaranteed: int = 0) -> Table:
    """The headline table: one row per configuration."""
    held = f", {guaranteed} replica(s) guaranteed" if guaranteed else ""
    t = Table(
        title=(
            f"A GenAI day in {minutes:g} min on the local runtime (1+1 nodes x 2 GPUs"
            f"{held}): measured, and the simulator's prediction"
        ),
        caption=(
            f"attainment: requests that waited <= {SLO_WAIT_S:g} s for a ready replica; "
            "reclaims: proactive/reactive; sim: the simulator on the run's own measurements"
        ),
    )
    for col in COLUMNS:
        t.add_column(col, justify="right")
    for config, r in results.items():
        m, p = r.measured, r.predicted
        t.add_row(
            LABELS.get(config, config),
            _f(m.avg_jct), _f(p.avg_jct), _f(r.ratio, 2), _pct(m.attainment),
            _pct(p.attainment), _f(m.p99_wait_s), _f(p.p99_wait_s), m.reclaims, p.reclaims,
            _f(m.lent_gpu_s, 0), _f(p.lent_gpu_s, 0), _f(r.wall_s, 0),
        )  # fmt: skip
    return t


def verdict(results: Mapping[str, Result]) -> list[str]:
    """The acceptance checks, in words."""
    lines = []
    kept = gain_kept(results)
    if "no-lending" in results and "slo" in results:
        a0, a1 = results["no-lending"].measured.attainment, results["slo"].measured.attainment
        if a0 is not None and a1 is not None:
            word = "at or above" if a1 >= a0 else "below"
            lines.append(
                f"--slo attainment {_pct(a1)} is {word} no lending's {_pct(a0)}; "
                f"it keeps {_pct(kept)} of reactive deepboot's JCT gain"
            )
    for config, r in results.items():
        ok = r.ratio is not None and abs(r.ratio - 1) <= 0.2
        lines.append(
            f"{LABELS.get(config, config)}: sim / measured JCT {_f(r.ratio, 2)} "
            f"({'within' if ok else 'NOT within'} 20%)"
        )
    return lines


def details(r: Result) -> str:
    """One configuration's per-job JCTs and measured costs, in a line."""
    cost = MeasuredRestart.of(r.runtime.measured)
    jobs = ", ".join(
        f"{j} {_f(r.measured.jct.get(j))}/{_f(r.predicted.jct.get(j))}"
        for j in sorted(r.measured.jct)
    )
    m, p = r.measured, r.predicted
    return (
        f"{LABELS.get(r.config, r.config)}: JCT measured/sim {jobs}; attainment once warm "
        f"{_pct(m.attainment_warm)}/{_pct(p.attainment_warm)}; requests {m.requests} "
        f"(unanswered {m.unanswered}); replica starts {m.cold_starts} (pre-warmed "
        f"{m.prewarms}), sim cold starts {p.cold_starts}; measured cold start (median) "
        f"{_f(_median(r.runtime.measured.cold_start_s, math.nan), 1)} s; pauses: start "
        f"{cost.start:.1f} s, shrink {cost.shrink:.1f} s, grow {cost.grow:.1f} s"
    )


def as_json(results: Mapping[str, Result], minutes: float, guaranteed: int = 0) -> dict[str, Any]:
    """Everything, as JSON-ready data."""
    return {
        "minutes": minutes,
        "guaranteed_replicas": guaranteed,
        "thin": THIN,
        "time_scale": time_scale(minutes),
        "slo_wait_s": SLO_WAIT_S,
        "load_s": LOAD_S,
        "gain_kept_by_slo": gain_kept(results),
        "configs": {
            c: {
                "setup": asdict(setup_for(c, minutes, guaranteed)),
                "measured": {**asdict(r.measured), "avg_jct_s": r.measured.avg_jct},
                "predicted": {**asdict(r.predicted), "avg_jct_s": r.predicted.avg_jct},
                "ratio_avg_jct": r.ratio,
                "wall_s": r.wall_s,
                "runtime": _as_dict(r.runtime),
                "sim": _as_dict(r.sim),
                "restart_cost": asdict(MeasuredRestart.of(r.runtime.measured)),
            }
            for c, r in results.items()
        },
    }


# -- running -----------------------------------------------------------------------------


def run_config(
    config: str, root: Path, minutes: float, console: Console, guaranteed: int = 0
) -> Result:
    """One configuration on a real local cluster, kept in ``root``, and simulated."""
    setup = setup_for(config, minutes, guaranteed)
    service, jobs, trace = write_inputs(root, setup, minutes)
    (root / "meta.json").write_text(json.dumps({"config": config, "minutes": minutes}) + "\n")
    day = minutes * 60.0
    rt = runtime_session(
        root,
        setup,
        service,
        jobs,
        load_args(trace, minutes),
        console,
        stop_load=False,
        timeout=3 * day + 600,
        exact_offset=True,
        warmup=load_args(trace, minutes, start=(1 - WARMUP) * DAY_TRACE_S),
    )
    meta = {"config": config, "minutes": minutes, "guaranteed": guaranteed, "wall_s": rt.wall_s}
    (root / "meta.json").write_text(json.dumps(meta) + "\n")
    return evaluate(config, root, rt, minutes, guaranteed)


def resim_config(root: Path) -> tuple[str, float, int, Result]:
    """A configuration kept by ``--keep`` in ``root``, re-read and re-simulated:
    (configuration, minutes, guaranteed replicas, result)."""
    meta = json.loads((root / "meta.json").read_text())
    config, minutes = str(meta["config"]), float(meta["minutes"])
    guaranteed = int(meta.get("guaranteed", 0))  # a run kept before the flag: 0
    rt = _resim(root, exact_offset=True)
    rt.wall_s = float(meta.get("wall_s", 0.0))  # the runtime run's
    return config, minutes, guaranteed, evaluate(config, root, rt, minutes, guaranteed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--minutes",
        type=float,
        default=MINUTES,
        help=f"length of the replayed day (default {MINUTES:g}; 2: a quick look, ~3 min a run)",
    )
    ap.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"which configurations, comma-separated (default: {','.join(CONFIGS)})",
    )
    ap.add_argument(
        "--guaranteed",
        type=int,
        default=0,
        help="the service's guaranteed_replicas, held whatever the load in every "
        "configuration (default 0: --slo holds what its forecast asks for, and none "
        "in a silence)",
    )
    ap.add_argument("--out", type=Path, help="also write everything as JSON")
    ap.add_argument("--keep", type=Path, help="keep the runtime runs here (DIR/<config>)")
    ap.add_argument(
        "--resim", type=Path, help="no runtime: re-simulate the runs kept in this --keep DIR"
    )
    args = ap.parse_args(argv)
    if not 0.5 <= args.minutes <= 120:
        ap.error("--minutes must be in [0.5, 120]")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        ap.error(
            f"--configs: unknown {', '.join(unknown) or '(none)'}; known: {', '.join(CONFIGS)}"
        )
    console = Console(width=180)
    started = time.monotonic()
    results: dict[str, Result] = {}
    minutes, guaranteed = args.minutes, args.guaranteed
    if not 0 <= guaranteed <= BASE.max_replicas:
        ap.error(f"--guaranteed must be in [0, {BASE.max_replicas}] (the service's max_replicas)")
    if args.resim:
        kept = [args.resim / c for c in CONFIGS if (args.resim / c / "meta.json").exists()]
        if not kept:
            ap.error(f"--resim: no kept configuration in {args.resim}")
        held = set()
        for root in kept:
            config, minutes, guaranteed, result = resim_config(root)
            results[config] = result
            held.add(guaranteed)
        if len(held) > 1:
            ap.error(f"--resim: the kept runs differ in guaranteed replicas ({sorted(held)})")
    else:
        with tempfile.TemporaryDirectory(prefix="deepboot-headline-") as tmp:
            base = args.keep or Path(tmp)
            for config in configs:
                console.print(f"{LABELS[config]}: a {minutes:g}-minute day")
                began = time.monotonic()
                try:
                    results[config] = run_config(
                        config, base / config, minutes, console, guaranteed
                    )
                except KeyboardInterrupt:  # the cluster is down (runtime_session's finally)
                    console.print("[red]interrupted[/red]")
                    return 130
                console.print(
                    f"  done in {time.monotonic() - began:.0f} s: avg JCT "
                    f"{_f(results[config].measured.avg_jct)} s, attainment "
                    f"{_pct(results[config].measured.attainment)}"
                )
    console.print(table(results, minutes, guaranteed))
    for line in verdict(results):
        console.print(line)
    for r in results.values():
        console.print(details(r))
    doc = as_json(results, minutes, guaranteed)
    doc["wall_s"] = time.monotonic() - started
    console.print(f"wall time {doc['wall_s']:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
