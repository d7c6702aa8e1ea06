"""The twin: one workload on the real local runtime, then in the simulator, side by side.

The workload: four elastic jobs of a fixed amount of work (``bench/twin_job.py``:
60, 80, 100 and 120 optimizer steps at a fixed total batch of 48, 20 ms of simulated
GPU time per sample, 1-4 workers; submitted 6 s apart) and one service
(``examples/runtime/echo_service.py``, 0.2 s a request, at most 2 replicas) under a
lull / spike / lull request rate (1 rps, then 8 rps from 60 s to 80 s, then 1 rps
until every job is done), on a cluster of 2 training + 1 inference nodes x 2 logical
GPUs, policy ``deepboot`` (restart_delay=10), 2 s rounds, protect factor 0.05, AFE
resizes.

1. **Runtime.** ``deepboot up`` a real local cluster (torch on the CPU), serve the
   service, replay the rate profile with ``deepboot load``, submit the jobs, wait for
   them, ``deepboot down``. From the store: each job's submit and finish (JCT), its
   (job, new size) decisions (``started``/``resized``/``preempted``, in time order),
   the GPUs lent (GPU-seconds from each ``lend`` to that GPU's ``reclaim`` or
   ``release``) and reclaimed; and the measurements the simulator is given: every
   job's measured (nodes, GPUs, local batch) -> (step, compute) seconds from the
   controller's online model, the pauses of AFE shrinks and grows and of starts
   (``resized.seconds``; first ``bind``/``lend`` -> ``started``), the replicas' cold
   starts (``replica ready.seconds``), the requests' send times and service times
   (each request's latency less the wait the router measured, ``X-Wait-Ms``).
2. **Simulator.** The same jobs (same submit times, same work), the same requests
   (one inference task per request sent, its duration that request's service time),
   the same cluster, policy, parameters, interval and protect factor, with
   applications whose step times are the runtime's own measurements (a throughput
   model fitted to them for a configuration the runtime never ran) and whose restart
   cost is the measured pauses: a job's own mean pause for a change from as many
   workers to as many where its runtime twin made one, else the mean pause of that
   kind of change (:class:`MeasuredRestart`). A fixed total batch (``batch_size =
   max_batch_size``, the initial batch) makes "fixed work" mean the same in both
   worlds: each step is one unit of progress in the simulator, as it is one step of
   the job. The simulator is deterministic given its inputs; it runs once per
   runtime run, on that run's measurements and requests.

Reported: per job the median JCT of each world, their ratio and the range of each
run's own ratio; per world the median lent GPU-seconds, reclaims and decisions; and
the agreement of the decision sequences: ``LCS(runtime, sim) / max(len)`` of the
(job, new size) sequences (a preemption is size 0; a runtime decision is timed when
it was made, not when its generation formed), with the first index where they
differ. The twin's simulator bounds each job as the runtime does
(``SimConfig(job_bounds="runtime")``: up to ``max_workers`` at once, at least
``min_workers``, pinned while a change is in its pause), and shows a policy a job's
gradient statistics only once it has run on 2 GPUs (``grad_min_replicas=2``: the
runtime's estimator compares ranks, and until a job has them its speedup is linear
in both worlds); each job's statistics are its runtime twin's last ones; and a
configuration's step time reaches the policy once the job ran 2 steps on it
(``profile_steps=2``: the runtime does not time a generation's first step). Column
``ref. rules`` is an ablation, not the twin: the simulator with the reference
simulator's rules (from 0 GPUs, at most twice the most a job has run on; statistics
known from the first step), to show how much of the difference those rules make.
The runtime runs on a shared 2-core machine, so its numbers are noisy.

    PYTHONPATH=. .venv/bin/python bench/twin.py                 # 3 + 3 runs (~13 min)
    PYTHONPATH=. .venv/bin/python bench/twin.py --runs 1        # a quick look (~4 min)
    PYTHONPATH=. .venv/bin/python bench/twin.py --out twin.json # also every run as JSON
    PYTHONPATH=. .venv/bin/python bench/twin.py --keep K        # keep the runtime runs in K
    PYTHONPATH=. .venv/bin/python bench/twin.py --resim K       # re-simulate them (seconds)
    PYTHONPATH=. .venv/bin/python bench/twin.py --resim K --sensitivity 10 --jitter 1
        # and each run 10 times more, every pause moved by up to 1 s: the simulator
        # against itself, under timing noise of the runtime's order
    PYTHONPATH=. .venv/bin/python bench/twin.py --command-job j2 --runs 1
        # j2 as a command job (a plain torchrun script, resized by restart)
    PYTHONPATH=. .venv/bin/python bench/twin.py --resim K --restart-delay 2
        # what the simulator does at another restart_delay on the same measurements
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import math
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
EXAMPLES = REPO / "examples" / "runtime"
sys.path.insert(0, str(REPO))

from runtime_cli import cli, cli_env, wait_for  # noqa: E402

from deepboot.core.cluster import ClusterSpec, Pool  # noqa: E402
from deepboot.core.gpu import GpuState  # noqa: E402
from deepboot.core.jobs import InferenceTaskSpec, TrainingJobSpec, Workload  # noqa: E402
from deepboot.core.params import BatchLimits, PerfParams  # noqa: E402
from deepboot.core.placement import EMPTY, Placement  # noqa: E402
from deepboot.core.service import DEFAULT_SLO_WAIT_S, ServiceSpec  # noqa: E402
from deepboot.perf.fit import fit_perf_params  # noqa: E402
from deepboot.perf.goodput import compute_time, step_time  # noqa: E402
from deepboot.report.timeline import load_offset  # noqa: E402
from deepboot.runtime.cluster.processes import process_alive  # noqa: E402
from deepboot.runtime.cluster.raycluster import ClusterRecord, cluster_pids  # noqa: E402
from deepboot.runtime.store.jobstore import EventRow, JobRow, JobStore, LogKind  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402

if TYPE_CHECKING:
    from deepboot.sim.engine import Simulation

# -- the workload ----------------------------------------------------------------------

BATCH = 48
"""Fixed total batch of every job: divisible by 1-4 workers (48, 24, 16, 12 each)."""
MIN_LOCAL = 12
"""Smallest per-GPU batch: BATCH // MIN_LOCAL = 4 = max_workers in both worlds."""
MAX_WORKERS = 4
SAMPLE_DELAY = 0.02
"""Simulated GPU seconds per sample: 0.96 s a step on 1 worker, 0.24 s on 4."""
STEPS_PER_EPOCH = 10
"""Steps of one simulated 'epoch' (the simulator re-picks the batch per epoch)."""
JOBS: tuple[tuple[str, float, int], ...] = (
    ("j1", 0.0, 60),
    ("j2", 6.0, 80),
    ("j3", 12.0, 100),
    ("j4", 18.0, 120),
)
"""(name, submit offset s, total steps) of each job."""
SERVICE_DELAY = 0.2
"""Seconds of simulated GPU time per request."""
RATE_PROFILE: tuple[tuple[float, float], ...] = ((0, 1.0), (60, 8.0), (80, 1.0), (900, 0.0))
"""(time s, rps) from the load's start: lull, spike (1.6 replicas' work: the lent
GPU is reclaimed), lull (the idle replica sleeps, its GPU is lent again) until the
jobs are done (the load is stopped then). The lull's requests come 1 s apart, well
inside the shortest protect time (0.05 x 30 s = 1.5 s): the replica that serves
them stays warm. At 0.5 rps (until 2026-12-03) they came 2 s apart, between the
protect time of a replica with no hit (1.5 s) and with one (2.25 s): whether it
slept, was lent at the next tick and taken back 0.2-0.6 s later by the next request
hung on the sub-second phase of the requests against the 2 s rounds, which differs
from run to run and from world to world."""
BAND = 0.2
"""The twin's bar: each JCT within 20% of the runtime's."""
TRAINING_NODES, INFERENCE_NODES, GPUS_PER_NODE = 2, 1, 2
INTERVAL = 2.0
PROTECT_FACTOR = 0.05
POLICY = "deepboot"
POLICY_PARAMS = {"restart_delay": 10}
"""DeepBoot's reference delta, and about what a change costs here (starts 8-10 s,
grows 4.5-7 s on average). At 2 (until 2026-12-03) the policy moved jobs on gains so
small that which way a round went hung on a second of a pause: re-simulated with
every pause moved by up to 2 s (``--sensitivity``), the simulator alone broke "every
median within 20%" in 38-60% of draws on four sets of kept runs; at 10, in 0% on
three and 24% on the fourth (docs/benchmarks.md, the twin)."""


@dataclass(frozen=True)
class Setup:
    """What both worlds run, besides the load: the jobs, the cluster, the policy and
    the shared-cluster switches. The defaults are the twin's (the constants above);
    ``bench/runtime_headline.py`` runs other ones through the same functions.

    Attributes:
        jobs: (name, submit offset s from the load's start, total steps at scale 1)
            of each job (``bench/twin_job.py``, the fixed batch above).
        training_nodes, inference_nodes, gpus_per_node: The cluster.
        interval: Seconds between rounds.
        protect_factor: The protect times' factor.
        policy, policy_params: The training policy.
        lending: Lend idle inference GPUs (False: ``deepboot up --no-lending``).
        slo: SLO-guarded lending (``deepboot up --slo``).
        service: The service's name (and each simulated request's).
        slo_wait_s: The service's request SLO (the simulator's ``ServiceSpec``; the
            runtime's is in its service file).
        requests_until_done: The simulator replays only the requests sent before the
            last job finished (the twin, whose load is stopped then); False: all.
        guaranteed_replicas: The service's replicas held whatever the load (its
            ``guaranteed_replicas``; the runtime's is in its service file).
        command_jobs: The jobs that run as command jobs: the same work as a plain
            torchrun script (``bench/twin_command_job.py``), resized by restart; the
            simulator runs them as ``resize="restart"`` jobs whose every change
            costs their measured restart (stop or start to first progress).
    """

    jobs: tuple[tuple[str, float, int], ...] = JOBS
    training_nodes: int = TRAINING_NODES
    inference_nodes: int = INFERENCE_NODES
    gpus_per_node: int = GPUS_PER_NODE
    interval: float = INTERVAL
    protect_factor: float = PROTECT_FACTOR
    policy: str = POLICY
    policy_params: tuple[tuple[str, object], ...] = tuple(POLICY_PARAMS.items())
    lending: bool = True
    slo: bool = False
    service: str = "echo"
    slo_wait_s: float = DEFAULT_SLO_WAIT_S
    requests_until_done: bool = True
    guaranteed_replicas: int = 0
    command_jobs: tuple[str, ...] = ()

    @property
    def max_replicas(self) -> int:
        """The service's replica cap: the inference pool's GPUs."""
        return self.inference_nodes * self.gpus_per_node

    def up_args(self) -> list[str]:
        """``deepboot up``'s arguments for this setup (``--state-dir`` aside)."""
        return [
            "--training-nodes", str(self.training_nodes), "--inference-nodes",
            str(self.inference_nodes), "--gpus-per-node", str(self.gpus_per_node),
            "--interval", str(self.interval), "--poll", "0.3", "--protect-factor",
            str(self.protect_factor), "--http-port", "0", "--collective-timeout", "15",
            "--policy", self.policy, *(f"--param={k}={v}" for k, v in self.policy_params),
            *([] if self.lending else ["--no-lending"]), *(["--slo"] if self.slo else []),
        ]  # fmt: skip


TWIN = Setup()
"""The twin's setup."""

# -- the runtime -----------------------------------------------------------------------


def _read(state: Path) -> tuple[list[JobRow], list[EventRow]]:
    store = JobStore(state / "deepboot.db")
    try:
        return store.jobs(), store.events()
    finally:
        store.close()


@dataclass
class Measured:
    """What one runtime run measured, for the simulator.

    Attributes:
        profile: (nodes, GPUs, local batch) -> [count, compute s sum, step s sum],
            summed over every job (one code, one speed).
        job_profile: The same, job by job: each job's own measurements, which its
            throughput fit (and so the policy's view of it) is made of.
        grad: Job -> its last gradient statistics (sqr, var), for the jobs that
            measured them (on 2 GPUs or more: the estimator compares ranks).
        start_s: Pauses of starts: a job's latest GPU op -> its ``started``, and
            resumes after a preemption (``resized`` from no worker).
        start_by_size: The same pauses by the number of workers started.
        shrink_s: ``seconds`` of each shrink (AFE, or a restart when no worker
            survives the move).
        grow_s: ``seconds`` of each grow (AFE or restart).
        grow_by_joiners: The same by the workers it added (each joiner is a new
            process: three take longer to start than one on a small machine).
        move_s: ``seconds`` of each same-size move (a restart: no survivor).
        cold_start_s: Cold starts of the service's replicas (``ready.seconds``).
        service_s: The median answer time of requests that found a warm replica.
        by_job: (job, workers before, workers after) -> the seconds of each such
            change of that job (starts and resumes from 0 workers): a job's own
            pauses, which differ from job to job by more than the kinds do (a start
            on 4 workers: 10 s for the first job, 17 s for the next, whose processes
            started while two replicas loaded).
        restart_s: A command job -> the measured cost of each of its starts and
            restarts (the event log's ``progressed``: the decision, or the stop, to
            its first progress); a command job's pauses are these, not ``by_job``'s.
    """

    profile: dict[tuple[int, int, int], list[float]] = field(default_factory=dict)
    job_profile: dict[str, dict[tuple[int, int, int], list[float]]] = field(default_factory=dict)
    grad: dict[str, tuple[float, float]] = field(default_factory=dict)
    start_s: list[float] = field(default_factory=list)
    start_by_size: dict[int, list[float]] = field(default_factory=dict)
    shrink_s: list[float] = field(default_factory=list)
    grow_s: list[float] = field(default_factory=list)
    grow_by_joiners: dict[int, list[float]] = field(default_factory=dict)
    by_job: dict[tuple[str, int, int], list[float]] = field(default_factory=dict)
    move_s: list[float] = field(default_factory=list)
    cold_start_s: list[float] = field(default_factory=list)
    service_s: float = SERVICE_DELAY
    restart_s: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class WorldRun:
    """One run of one world, on a common clock (seconds from the runtime's first round).

    Attributes:
        submit: Job -> submit time.
        finish: Job -> finish time (missing: it did not finish).
        decisions: (time, job, new size) of every placement change, in time order.
        lent_gpu_s: GPU-seconds inference GPUs spent lent to training.
        reclaims: Lent GPUs taken back by inference.
        requests: (send time, service time) of every request, in send order
            (runtime only): the service time is the request's latency less the wait
            the router measured (``X-Wait-Ms``), or the run's ``service_s`` for a
            request without one (no header, or no answer)
        measured: The runtime's measurements (runtime only).
        wall_s: Seconds the run took.
    """

    submit: dict[str, float] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    decisions: list[tuple[float, str, int]] = field(default_factory=list)
    lent_gpu_s: float = 0.0
    reclaims: int = 0
    requests: list[tuple[float, float]] = field(default_factory=list)
    measured: Measured = field(default_factory=Measured)
    wall_s: float = 0.0

    def jct(self, job: str) -> float | None:
        if job not in self.finish:
            return None
        return self.finish[job] - self.submit[job]


def _write_inputs(work: Path, scale: float, setup: Setup) -> tuple[Path, list[Path], Path]:
    work.mkdir(parents=True, exist_ok=True)
    service = work / "echo.toml"
    service.write_text(
        f'name = "echo"\nmodel = "tiny-mlp"\nhandler = "{EXAMPLES / "echo_service.py"}:load"\n'
        f"concurrency = 1\nmax_replicas = {INFERENCE_NODES * GPUS_PER_NODE}\n"
        f"queue_bound = 1000\nrequest_timeout_s = 300\n[args]\ndelay_s = {SERVICE_DELAY}\n"
    )
    jobs = write_jobs(work, setup, scale)
    profile = work / "rate.csv"
    profile.write_text("time_s,rps\n" + "".join(f"{t},{r}\n" for t, r in RATE_PROFILE))
    return service, jobs, profile


def write_jobs(work: Path, setup: Setup, scale: float) -> list[Path]:
    """The job files of ``setup``'s jobs in ``work`` (``bench/twin_job.py``, each with
    its steps at ``scale``), in ``setup.jobs``'s order."""
    work.mkdir(parents=True, exist_ok=True)
    jobs = []
    for name, _, steps in setup.jobs:
        path = work / f"{name}.toml"
        if name in setup.command_jobs:
            argv = [
                "python", str(BENCH / "twin_command_job.py"), "--total-steps",
                str(_steps(steps, scale)), "--checkpoint-dir", "{checkpoint_dir}", "--batch",
                str(BATCH), "--sample-delay", str(SAMPLE_DELAY), "--checkpoint-every", "2",
            ]  # fmt: skip
            path.write_text(
                f'name = "{name}"\ncommand = {json.dumps(argv)}\n'
                f"min_workers = 1\nmax_workers = {MAX_WORKERS}\n"
                f"batch_size = {BATCH}\nmax_batch_size = {BATCH}\n"
                f"min_local_batch_size = {MIN_LOCAL}\nmax_local_batch_size = {BATCH}\n"
            )
            jobs.append(path)
            continue
        path.write_text(
            f'name = "{name}"\nentry = "{BENCH / "twin_job.py"}:train"\n'
            f"min_workers = 1\nmax_workers = {MAX_WORKERS}\n"
            f"batch_size = {BATCH}\nmax_batch_size = {BATCH}\n"
            f"min_local_batch_size = {MIN_LOCAL}\nmax_local_batch_size = {BATCH}\n"
            "checkpoint_every = 50\n"
            f"[args]\ntotal_steps = {_steps(steps, scale)}\nsample_delay = {SAMPLE_DELAY}\n"
        )
        jobs.append(path)
    return jobs


def _steps(steps: int, scale: float) -> int:
    """A job's steps at ``scale``, a whole number of simulated epochs."""
    return max(STEPS_PER_EPOCH, round(steps * scale / STEPS_PER_EPOCH) * STEPS_PER_EPOCH)


def _interruptible() -> None:
    """In the load's child process before exec: SIGINT back to its default, so that
    the load stops and writes its CSV on the SIGINT the bench sends even when the bench
    itself runs in the background (where the shell starts it with SIGINT ignored,
    which a child inherits and Python then leaves ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def runtime_run(work: Path, scale: float, console: Console, setup: Setup = TWIN) -> WorldRun:
    """One run of the workload on a real local cluster (see the module docstring)."""
    service, jobs, profile = _write_inputs(work, scale, setup)
    return runtime_session(
        work, setup, service, jobs, ["echo", "--rate-profile", str(profile)], console
    )


def runtime_session(
    work: Path,
    setup: Setup,
    service: Path,
    jobs: Sequence[Path],
    load_args: Sequence[str],
    console: Console,
    *,
    stop_load: bool = True,
    timeout: float = 1800,
    exact_offset: bool = False,
    warmup: Sequence[str] = (),
) -> WorldRun:
    """One run on a real local cluster: ``deepboot up`` (``setup.up_args()``), serve
    ``service``, start ``deepboot load LOAD_ARGS`` (its requests CSV:
    ``work/requests.csv``; its start time: ``work/load_started``), submit ``jobs`` at
    their offsets from the load's start, wait for every job to finish, then (with
    ``stop_load``) stop the load with SIGINT, or (without) wait for it to end by
    itself; read the run back and ``deepboot down``, whatever happened.

    Args:
        timeout: Most seconds to wait for the jobs, and then for the load.
        warmup: ``deepboot load`` arguments of a load run to its end before the
            load and the jobs start (its CSV: ``work/warmup.csv``); none if empty.
        exact_offset: Put the requests on the run's clock by their ``sent_at``
            (:func:`_runtime_result`).

    Raises:
        RuntimeError: a command or a job failed, or the load wrote no CSV.
        TimeoutError: the jobs or the load did not end within ``timeout``.
    """
    state = work / "state"
    started = time.monotonic()
    record: ClusterRecord | None = None
    load: subprocess.Popen[str] | None = None
    out = work / "requests.csv"
    try:
        cli(state, "up", *setup.up_args())
        record = ClusterRecord.load(StateDir.at(state))
        cli(state, "serve", str(service))
        if warmup:
            console.print("  warming up the service")
            cli(state, "load", *warmup, "--out", str(work / "warmup.csv"), "-q", timeout=timeout)
        load_started = time.time()
        (work / "load_started").write_text(repr(load_started))
        with (work / "load.err").open("w") as err:
            load = subprocess.Popen(
                [sys.executable, "-m", "deepboot.cli.main", "load", *load_args, "--out",
                 str(out), "-q", "--state-dir", str(state)],
                cwd=REPO, env=cli_env(), stdout=subprocess.DEVNULL, stderr=err, text=True,
                preexec_fn=_interruptible,
            )  # fmt: skip
        running = load
        for path, (name, offset, _) in zip(jobs, setup.jobs, strict=True):
            delay = load_started + offset - time.time()
            if delay > 0:
                time.sleep(delay)
            cli(state, "submit", str(path))
            console.print(f"  submitted {name} at +{time.time() - load_started:.1f} s")

        def done() -> bool:
            if running.poll() not in (None, 0):
                err_text = (work / "load.err").read_text(errors="replace")
                raise RuntimeError(
                    f"'deepboot load' failed (exit {running.returncode}): {err_text}"
                )
            rows, _ = _read(state)
            bad = [r for r in rows if r.state.value in ("failed", "cancelled")]
            if bad:
                raise RuntimeError(f"job {bad[0].name} {bad[0].state.value}: {bad[0].message}")
            return len(rows) == len(setup.jobs) and all(r.state.value == "finished" for r in rows)

        wait_for("every job to finish", done, timeout=timeout, every=2.0)
        if stop_load:
            load.send_signal(signal.SIGINT)
            try:
                load.wait(60)
            except subprocess.TimeoutExpired:
                load.kill()
                load.wait(10)
        else:
            console.print(
                f"  jobs done at +{time.time() - load_started:.0f} s; waiting for the load"
            )
            wait_for("the load to end", lambda: running.poll() is not None, timeout, every=1.0)
        if not out.exists():
            err_text = (work / "load.err").read_text(errors="replace")
            raise RuntimeError(
                f"'deepboot load' wrote no {out} (exit {load.returncode}): {err_text}"
            )
        rows, log = _read(state)
        return _runtime_result(
            rows, log, out, load_started, time.monotonic() - started, exact_offset=exact_offset,
            tick0=first_tick(state),
        )  # fmt: skip
    finally:
        if load is not None and load.poll() is None:
            load.kill()
            load.wait(10)
        if record is None and (state / "cluster.json").exists():
            record = ClusterRecord.load(StateDir.at(state))  # 'up' started, then failed
        subprocess.run(
            [sys.executable, "-m", "deepboot.cli.main", "down", "--state-dir", str(state)],
            capture_output=True,
            cwd=REPO,
            env=cli_env(),
            timeout=300,
        )
        left = set() if record is None else {p for p in cluster_pids(record) if process_alive(p)}
        if left:
            console.print(f"[red]'deepboot down' left processes running: {sorted(left)}[/red]")


def _runtime_result(
    rows: list[JobRow],
    log: list[EventRow],
    requests: Path,
    load_started: float,
    wall_s: float,
    *,
    exact_offset: bool = False,
    tick0: float | None = None,
) -> WorldRun:
    """Turn a finished run's store and request log into a :class:`WorldRun`.

    The run's clock starts at its first round (``tick0``, Unix time; None: at the
    controller's start), as the simulator's rounds start at 0: both worlds' rounds
    then fall at the same seconds (the controller starts its rounds ~1 s after it
    starts, once its compiled kernels are loaded; a job submitted in between waited
    for a round 2 s later in the simulator). The requests are put on the run's clock
    by the load's first replica start
    (:func:`~deepboot.report.timeline.load_offset`), or with ``exact_offset`` by
    their Unix send times (``sent_at``, where the CSV has them): with ``--slo`` a
    pre-warmed replica may take the first request, which then starts none.
    """
    t0 = next(e.time for e in log if e.kind is LogKind.CONTROLLER_STARTED)
    t0 = t0 if tick0 is None else tick0
    run = WorldRun(wall_s=wall_s)
    m = run.measured
    for row in rows:
        run.submit[row.name] = row.submitted - t0
        if row.finished is not None:
            run.finish[row.name] = row.finished - t0
        model = json.loads(row.model or "{}")
        own = m.job_profile.setdefault(row.name, {})
        for p in model.get("profile", []):
            key = (int(p[0]), int(p[1]), int(p[2]))
            own[key] = [float(p[3 + i]) for i in range(3)]
            acc = m.profile.setdefault(key, [0.0, 0.0, 0.0])
            for i in range(3):
                acc[i] += float(p[3 + i])
        if model.get("grad"):
            m.grad[row.name] = (float(model["grad"][0]), float(model["grad"][1]))
    last_op: dict[str, float] = {}
    lent_since: dict[str, float] = {}
    end = max(run.finish.values(), default=log[-1].time - t0)
    # A command job's changes pause it until its first progress (``progressed``), not
    # until its processes start (``started``/``resized``, logged then): its pauses
    # are those, apart.
    commands = {row.name for row in rows if row.spec.command}
    for e in log:
        t = e.time - t0
        d = e.detail
        if e.kind is LogKind.PROGRESSED and e.job:
            m.restart_s.setdefault(e.job, []).append(float(d["seconds"]))
        if e.job in commands and e.kind in (LogKind.STARTED, LogKind.RESIZED):
            gone = float(d.get("seconds", t - last_op.get(e.job, t)))
            run.decisions.append((t - gone, e.job, len(d.get("to", d.get("workers", [])))))
            continue
        if e.kind is LogKind.GPU:
            if e.job and d["op"] in ("bind", "lend"):
                last_op[e.job] = t
            if d["op"] == "lend":
                lent_since[d["gpu"]] = t
            elif d["op"] in ("reclaim", "release") and d["gpu"] in lent_since:
                run.lent_gpu_s += min(t, end) - min(lent_since.pop(d["gpu"]), end)
                run.reclaims += d["op"] == "reclaim"
        elif e.kind is LogKind.STARTED and e.job:
            # Logged once the generation formed: decided at the job's latest GPU op
            # (a job cannot change size while its generation forms).
            run.decisions.append((last_op.get(e.job, t), e.job, len(d["workers"])))
            if e.job in last_op:
                m.start_s.append(t - last_op[e.job])
                m.start_by_size.setdefault(len(d["workers"]), []).append(m.start_s[-1])
                m.by_job.setdefault((e.job, 0, len(d["workers"])), []).append(m.start_s[-1])
        elif e.kind is LogKind.RESIZED and e.job:
            # Logged once the generation formed: the decision was ``seconds`` earlier.
            run.decisions.append((t - float(d["seconds"]), e.job, len(d["to"])))
            old, new = len(d["from"]), len(d["to"])
            if old == 0:
                m.start_by_size.setdefault(new, []).append(float(d["seconds"]))
            kind = m.start_s if old == 0 else m.move_s if old == new else None
            kind = kind if kind is not None else m.shrink_s if new < old else m.grow_s
            kind.append(float(d["seconds"]))
            m.by_job.setdefault((e.job, old, new), []).append(float(d["seconds"]))
            if 0 < old < new:
                m.grow_by_joiners.setdefault(new - old, []).append(float(d["seconds"]))
        elif e.kind is LogKind.PREEMPTED and e.job:
            run.decisions.append((t, e.job, 0))
        elif e.kind is LogKind.REPLICA and d.get("op") == "ready" and "seconds" in d:
            m.cold_start_s.append(float(d["seconds"]))
    for since in lent_since.values():
        run.lent_gpu_s += max(end - since, 0.0)
    run.decisions.sort()
    with requests.open() as f:
        sent = [r for r in csv.DictReader(f) if r["send_s"]]
    if sent:
        # The load's first request starts the first replica after the load began:
        # that puts send_s on the common clock.
        offset = load_offset(log, t0, min(float(r["send_s"]) for r in sent), after=load_started)
        if exact_offset:
            offset = _sent_at_offset(sent, t0, offset)
        warm = sorted(float(r["latency_s"]) for r in sent if r["status"] == "200")
        if warm:
            # The fastest quarter: requests that found an idle warm replica.
            m.service_s = statistics.median(warm[: max(1, len(warm) // 4)])
        run.requests = sorted(
            (float(r["send_s"]) + offset, _service_time(r, m.service_s)) for r in sent
        )
    return run


def _sent_at_offset(sent: Sequence[dict[str, str]], t0: float, default: float) -> float:
    """Seconds to add to ``send_s`` to put it on the clock whose second 0 is Unix time
    ``t0``: the median of ``sent_at - send_s - t0`` over the rows that have a
    ``sent_at``, else ``default``."""
    got = [
        float(r["sent_at"]) - float(r["send_s"]) - t0
        for r in sent
        if r.get("sent_at") and r["sent_at"] != "nan"
    ]
    return statistics.median(got) if got else default


def _service_time(row: dict[str, str], default: float) -> float:
    """A request's own service time: its latency less the router's measured wait
    (the ``wait_s`` column, from ``X-Wait-Ms``), else ``default``."""
    if row["status"] != "200" or not row.get("wait_s") or not row.get("latency_s"):
        return default
    return max(float(row["latency_s"]) - float(row["wait_s"]), 0.0)


# -- the simulator ---------------------------------------------------------------------


class TwinApplication:
    """An :class:`~deepboot.perf.application.Application` of the runtime's measurements.

    ``step_time`` is the runtime job's own mean (step, step - compute) at a (nodes,
    GPUs, local batch) it measured (so the simulated job's throughput fit is made of
    the same points as its runtime twin's), else every job's mean there, else the
    throughput model fitted to every measured point;
    ``grad_stats`` the runtime job's last gradient statistics (or another job's: a job
    that never ran on 2 GPUs measured none, and the twin's simulator shows them only
    once it has, ``grad_min_replicas=2``); one epoch is
    ``STEPS_PER_EPOCH`` steps at the fixed batch (progress counts steps: gain 1 at
    the initial batch), so the job ends after exactly its ``total_steps``.
    """

    def __init__(
        self,
        name: str,
        total_steps: int,
        profile: dict[tuple[int, int, int], list[float]],
        grad: tuple[float, float] | None,
        own: dict[tuple[int, int, int], list[float]] | None = None,
    ) -> None:
        self.name = name
        self.limits = BatchLimits(BATCH, BATCH, MIN_LOCAL, BATCH)
        self.max_epochs = total_steps // STEPS_PER_EPOCH
        self._table = {
            k: (v[2] / v[0], (v[2] - v[1]) / v[0])
            for k, v in [*profile.items(), *(own or {}).items()]  # its own ones win
        }
        keys = sorted(profile)
        self._fit: PerfParams = fit_perf_params(
            [k[0] for k in keys],
            [k[1] for k in keys],
            [k[2] for k in keys],
            [profile[k][1] / profile[k][0] for k in keys],
            [profile[k][2] / profile[k][0] for k in keys],
        )
        self._grad = grad or (1.0, 0.0)

    def step_time(self, shape: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        hit = self._table.get((len(shape), sum(shape), local_bsz))
        if hit is not None:
            return hit
        step = float(step_time(self._fit, len(shape), sum(shape), local_bsz))
        return step, step - float(compute_time(self._fit, local_bsz))

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        return self._grad

    def progress_at(self, epoch: int) -> float:
        return float(epoch * STEPS_PER_EPOCH)


@dataclass(frozen=True)
class MeasuredRestart:
    """Restart cost (a ``RestartCostModel``): the job's own mean pause of a change
    from as many workers to as many (``by_job``; the simulated job's application is
    its name) where its runtime twin made one, else the runtime's mean pause of that
    kind of placement change (start or resume, by the workers started where measured;
    shrink; grow, by the workers added where measured; same-size move), whatever the
    runtime did (AFE where a worker survives, else a restart), so the expected cost of
    a change is the runtime's."""

    start: float
    shrink: float
    grow: float
    move: float
    start_by_size: dict[int, float] = field(default_factory=dict)
    grow_by_joiners: dict[int, float] = field(default_factory=dict)
    by_job: dict[tuple[str, int, int], float] = field(default_factory=dict)

    @classmethod
    def of(cls, m: Measured) -> MeasuredRestart:
        start = _mean(m.start_s, 5.0)
        grow = _mean(m.grow_s, start)
        by_size = {k: _mean(v, start) for k, v in sorted(m.start_by_size.items())}
        by_joiners = {k: _mean(v, grow) for k, v in sorted(m.grow_by_joiners.items())}
        by_job = {k: _mean(v, start) for k, v in sorted(m.by_job.items())}
        return cls(
            start, _mean(m.shrink_s, 0.5), grow, _mean(m.move_s, grow), by_size, by_joiners,
            by_job,
        )  # fmt: skip

    def delay(
        self, application: str, old_replicas: int, new_replicas: int, first_start: bool
    ) -> float:
        own = self.by_job.get((application, old_replicas, new_replicas))
        if own is not None:
            return own
        if old_replicas == 0:
            return self.start_by_size.get(new_replicas, self.start)
        if new_replicas == old_replicas:
            return self.move
        if new_replicas < old_replicas:
            return self.shrink
        return self.grow_by_joiners.get(new_replicas - old_replicas, self.grow)


class JitteredRestart:
    """A :class:`MeasuredRestart` whose every pause is moved by up to ``jitter`` seconds
    either way (uniform; seeded, so a run is reproducible): the simulator against
    itself under timing noise of the runtime's order (one job's pause for one change
    differs between runs with an SD of about 1.8 s here), for ``--sensitivity``."""

    def __init__(self, base: MeasuredRestart, jitter: float, seed: int) -> None:
        self.base, self.jitter = base, jitter
        self._rng = np.random.default_rng(seed)

    def delay(
        self, application: str, old_replicas: int, new_replicas: int, first_start: bool
    ) -> float:
        pause = self.base.delay(application, old_replicas, new_replicas, first_start)
        return max(pause + float(self._rng.uniform(-self.jitter, self.jitter)), 0.0)


def _mean(values: Sequence[float], default: float) -> float:
    return statistics.fmean(values) if values else default


def _median(values: Sequence[float], default: float) -> float:
    return statistics.median(values) if values else default


def sim_run(
    rt: WorldRun,
    scale: float,
    reference: bool = False,
    jitter: float = 0.0,
    seed: int = 0,
    setup: Setup = TWIN,
) -> WorldRun:
    """The simulator on ``rt``'s workload, measurements and requests: the twin (jobs
    bounded as the runtime bounds them, ``SimConfig.job_bounds="runtime"``, and their
    gradient statistics seen once they ran on 2 GPUs, as the runtime's estimator
    needs), or with ``reference`` the ablation with the reference simulator's rules
    (its sizing; statistics known from the first step). ``jitter`` > 0: every pause
    moved by up to that many seconds (:class:`JitteredRestart`, seeded by ``seed``)."""
    return simulate(rt, setup, scale, reference, jitter, seed)[0]


def simulate(
    rt: WorldRun,
    setup: Setup,
    scale: float,
    reference: bool = False,
    jitter: float = 0.0,
    seed: int = 0,
) -> tuple[WorldRun, Simulation]:
    """:func:`sim_run` for any ``setup``: the run, and the simulation it came from
    (its serving side has each request's record and the reclaims)."""
    from deepboot.policies import registry
    from deepboot.scheduler import Scheduler
    from deepboot.sim.config import SimConfig
    from deepboot.sim.engine import Simulation
    from deepboot.world.settings import SharedCluster

    m = rt.measured
    started = time.perf_counter()
    steps = {name: _steps(s, scale) for name, _, s in setup.jobs}
    anyone = next(iter(m.grad.values()), None)
    apps = {
        name: TwinApplication(
            name, steps[name], m.profile, m.grad.get(name, anyone), m.job_profile.get(name)
        )
        for name in steps
    }
    training = tuple(
        TrainingJobSpec(name, rt.submit[name], name, 1, BATCH)
        if name not in m.restart_s
        else TrainingJobSpec(
            name,
            rt.submit[name],
            name,
            1,
            BATCH,
            resize="restart",
            restart_cost=statistics.median(m.restart_s[name]),
        )  # fmt: skip
        for name in sorted(steps, key=lambda n: rt.submit[n])
    )
    cold = _median(m.cold_start_s, 2.0)
    service = ServiceSpec(
        name=setup.service,
        model="tiny-mlp",
        concurrency=1,
        max_replicas=setup.max_replicas,
        cold_start_s=cold,
        slo_wait_s=setup.slo_wait_s,
        guaranteed_replicas=setup.guaranteed_replicas,
    )
    until = max(rt.finish.values(), default=math.inf) if setup.requests_until_done else math.inf
    inference = tuple(
        InferenceTaskSpec(f"r{i}", t, setup.service, "tiny-mlp", service_s, 1)
        for i, (t, service_s) in enumerate(rt.requests)
        if t <= until
    )
    workload = Workload("twin", training, inference, (service,))
    cluster = ClusterSpec.parse(
        f"{setup.training_nodes + setup.inference_nodes}x{setup.gpus_per_node}",
        setup.inference_nodes,
    )
    settings = SharedCluster(
        lending=setup.lending, protect_factor=setup.protect_factor, afe=True, slo=setup.slo
    ).sim_kwargs(inference_nodes=setup.inference_nodes, policy=setup.policy)
    measured = MeasuredRestart.of(m)
    settings["restart"] = JitteredRestart(measured, jitter, seed) if jitter > 0 else measured
    config = SimConfig(
        interval=setup.interval,
        app_max_replicas=dict.fromkeys(steps, MAX_WORKERS),
        cold_start={"tiny-mlp": cold},
        job_bounds="reference" if reference else "runtime",
        grad_min_replicas=1 if reference else 2,
        profile_steps=0 if reference else 2,
        **settings,
    )
    policy = registry.create(setup.policy, **dict(setup.policy_params))
    sim = Simulation(workload, cluster, Scheduler(policy), apps, config)
    out = WorldRun(submit={j.name: j.submit_time for j in training})
    last: dict[str, Placement] = {}

    def watch(now: float, event: object, s: Simulation) -> None:
        for job in s.jobs:
            if job.completion is not None and job.completion <= now:
                continue
            if job.placement != last.get(job.name, EMPTY):
                last[job.name] = job.placement
                out.decisions.append((now, job.name, job.placement.num_replicas))

    sim.run(None, watch)
    for job in sim.jobs:
        if job.completion is not None:
            out.finish[job.name] = job.completion
    out.lent_gpu_s = float(sum(sim.board.gpu_seconds(p).get(GpuState.LENT, 0.0) for p in Pool))
    out.reclaims = 0 if sim.serving is None else len(sim.serving.reclaim_times)
    out.wall_s = time.perf_counter() - started
    return out, sim


# -- comparing ---------------------------------------------------------------------------


def lcs(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the longest common subsequence of ``a`` and ``b``."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def agreement(rt: WorldRun, sim: WorldRun) -> tuple[float, int, int, int | None]:
    """(LCS / max length, runtime length, sim length, first differing index or None)
    of the two (job, new size) sequences."""
    a = [(j, n) for _, j, n in rt.decisions]
    b = [(j, n) for _, j, n in sim.decisions]
    common = lcs(a, b)
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return common / max(len(a), len(b), 1), len(a), len(b), first


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _med(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


Trio = tuple[WorldRun, WorldRun, WorldRun]
"""One runtime run, the twin's simulation of it, and the reference-rules ablation."""


def report(runs: list[Trio], console: Console) -> dict[str, Any]:
    """Print the side-by-side table; return it as data."""
    names = [n for n, _, _ in JOBS]
    doc: dict[str, Any] = {"runs": len(runs), "jobs": {}, "totals": {}}
    table = Table(
        title=f"The twin: runtime vs simulator (median of {len(runs)} runs each)",
        caption=(
            "sim: the twin (jobs bounded, and their gradient statistics seen, as on the "
            "runtime); ref. rules: the reference simulator's instead (an ablation, see --help)"
        ),
    )
    for col in ("", "runtime", "sim", "sim / runtime", "per run", "ref. rules", "ref / runtime"):
        table.add_column(col, justify="right")
    for name in names:
        r = _med([rt.jct(name) for rt, _, _ in runs])
        s = _med([sim.jct(name) for _, sim, _ in runs])
        b = _med([sim.jct(name) for _, _, sim in runs])
        doc["jobs"][name] = {
            "runtime_jct_s": r,
            "sim_jct_s": s,
            "ratio": _ratio(s, r),
            "sim_reference_rules_jct_s": b,
            "ratio_reference_rules": _ratio(b, r),
        }
        each = [_ratio(sim.jct(name), rt.jct(name)) for rt, sim, _ in runs]
        got = [x for x in each if x is not None]
        doc["jobs"][name]["ratio_per_run"] = each
        table.add_row(
            f"JCT {name} (s)",
            _fmt(r),
            _fmt(s),
            _fmt(_ratio(s, r), 2),
            f"{min(got):.2f}-{max(got):.2f}" if got else "-",
            _fmt(b),
            _fmt(_ratio(b, r), 2),
        )
    getters: tuple[tuple[str, str, Callable[[WorldRun], float]], ...] = (
        ("lent GPU-s", "lent_gpu_s", lambda w: w.lent_gpu_s),
        ("reclaims", "reclaims", lambda w: float(w.reclaims)),
        ("decisions (job, size)", "decisions", lambda w: float(len(w.decisions))),
    )
    for label, key, get in getters:
        r = _med([get(rt) for rt, _, _ in runs])
        s = _med([get(sim) for _, sim, _ in runs])
        b = _med([get(sim) for _, _, sim in runs])
        doc["totals"][key] = {"runtime": r, "sim": s, "sim_reference_rules": b}
        table.add_row(
            label, _fmt(r), _fmt(s), _fmt(_ratio(s, r), 2), "", _fmt(b), _fmt(_ratio(b, r), 2)
        )
    cells = []
    for which in (1, 2):
        agrees = [agreement(trio[0], trio[which]) for trio in runs]
        share = _med([a[0] for a in agrees])
        firsts = ", ".join("-" if a[3] is None else str(a[3]) for a in agrees)
        doc["totals"]["agreement" if which == 1 else "agreement_reference_rules"] = {
            "lcs_over_max": share,
            "first_difference": [a[3] for a in agrees],
        }
        cells.append(f"{_fmt(share, 2)} (1st diff at {firsts})")
    table.add_row("decision agreement (LCS / max len)", "", "", cells[0], "", "", cells[1])
    console.print(table)
    for i, (rt, sim, ref) in enumerate(runs):
        m = rt.measured
        cost = MeasuredRestart.of(m)
        console.print(
            f"run {i + 1}: runtime {rt.wall_s:.0f} s; measured means: start {cost.start:.2f} s "
            f"({', '.join(f'{k}: {v:.1f}' for k, v in cost.start_by_size.items())}), "
            f"shrink {cost.shrink:.2f} s, grow {cost.grow:.2f} s "
            f"({', '.join(f'+{k}: {v:.1f}' for k, v in cost.grow_by_joiners.items())}), "
            f"move {cost.move:.2f} s; "
            f"cold start (median) {_fmt(_median(m.cold_start_s, math.nan), 2)} s, service "
            f"{m.service_s:.3f} s; step s by GPUs@nodes: "
            + ", ".join(f"{k[1]}@{k[0]} {v[2] / v[0]:.3f}" for k, v in sorted(m.profile.items()))
        )
        console.print(f"  runtime decisions: {_seq(rt)}")
        console.print(f"  sim decisions:     {_seq(sim)}")
        console.print(f"  ref. decisions:    {_seq(ref)}")
        doc.setdefault("per_run", []).append(
            {
                "runtime": _as_dict(rt),
                "sim": _as_dict(sim),
                "sim_reference_rules": _as_dict(ref),
                "agreement": agreement(rt, sim)[0],
                "first_difference": agreement(rt, sim)[3],
                "restart_cost": {
                    **dataclasses.asdict(cost),
                    "by_job": {"|".join(map(str, k)): v for k, v in cost.by_job.items()},
                },
            }
        )
    return doc


def _outside(ratios: Sequence[float], band: float = BAND) -> str:
    """ "k/n" of ``ratios`` farther than ``band`` from 1."""
    return f"{sum(abs(r - 1.0) > band for r in ratios)}/{len(ratios)}"


def _span(ratios: Sequence[float]) -> str:
    return f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"


def sensitivity(
    runs: list[Trio],
    scale: float,
    n: int,
    jitter: float,
    console: Console,
    setup: Setup = TWIN,
) -> dict[str, Any]:
    """The simulator against itself: each run re-simulated ``n`` times with every pause
    moved by up to ``jitter`` s (:class:`JitteredRestart`), against the unmoved
    simulation of that run, beside the runtime against the simulator.

    Per job: the single-run ratios outside +-20% and their range; and the twin's own
    statistic, the median of one moved simulation per run against the median of the
    unmoved ones, over every combination (``n`` ** runs): how often a simulator that
    differs from the runtime only by that timing noise would fail "every JCT within
    20%". Returns the table as data.
    """
    names = [name for name, _, _ in JOBS]
    moved = [
        [sim_run(rt, scale, jitter=jitter, seed=1000 * (i + 1) + k, setup=setup) for k in range(n)]
        for i, (rt, _, _) in enumerate(runs)
    ]
    table = Table(
        title=f"The simulator against itself: {n} runs each with every pause moved by "
        f"up to {jitter:g} s",
        caption="single run: each job's JCT / the unmoved simulation's (the runtime: "
        "runtime / sim swapped to sim / runtime); median of 3: over every combination "
        "of one moved simulation per run",
    )
    for col in ("", "sim / runtime: outside 20%", "range", "moved / sim: outside 20%",
                "range", "median of 3 outside 20%", "range"):  # fmt: skip
        table.add_column(col, justify="right")
    doc: dict[str, Any] = {"n": n, "jitter_s": jitter, "jobs": {}}
    combos = list(itertools.product(range(n), repeat=len(runs)))
    any_out = [False] * len(combos)
    for name in names:
        base = [sim.jct(name) for _, sim, _ in runs]
        twin = [r for rt, sim, _ in runs if (r := _ratio(sim.jct(name), rt.jct(name)))]
        single = [
            r
            for ps, b in zip(moved, base, strict=True)
            for p in ps
            if (r := _ratio(p.jct(name), b))
        ]
        med_base = _med(base)
        meds: list[float] = []
        for c, combo in enumerate(combos):
            got = [j for i, k in enumerate(combo) if (j := moved[i][k].jct(name)) is not None]
            if med_base and len(got) == len(combo):
                r = statistics.median(got) / med_base
                meds.append(r)
                any_out[c] = any_out[c] or abs(r - 1.0) > BAND
        table.add_row(f"JCT {name}", _outside(twin), _span(twin), _outside(single),
                      _span(single), _outside(meds), _span(meds))  # fmt: skip
        doc["jobs"][name] = {"twin": twin, "moved": single, "median_of_runs": meds}
    agree = [agreement(sim, p)[0] for (_, sim, _), ps in zip(runs, moved, strict=True) for p in ps]
    share = sum(any_out) / len(any_out) if any_out else 0.0
    table.add_row("any job's median of 3 outside 20%", "", "", "", "", f"{share:.0%}", "")
    table.add_row("decision agreement with the unmoved sim", "", "", "",
                  f"median {statistics.median(agree):.2f}", "", _span(agree))  # fmt: skip
    doc["any_median_outside"] = share
    doc["agreement"] = agree
    console.print(table)
    return doc


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _seq(run: WorldRun) -> str:
    return " ".join(f"{j}:{n}@{t:.0f}" for t, j, n in run.decisions)


def _as_dict(run: WorldRun) -> dict[str, Any]:
    out = dataclasses.asdict(run)
    out["measured"]["profile"] = [[*k, *v] for k, v in sorted(run.measured.profile.items())]
    out["measured"]["job_profile"] = {
        job: [[*k, *v] for k, v in sorted(own.items())]
        for job, own in run.measured.job_profile.items()
    }
    out["measured"]["by_job"] = {"|".join(map(str, k)): v for k, v in run.measured.by_job.items()}
    out["requests"] = len(run.requests)
    return out


def _resim(root: Path, exact_offset: bool = False) -> WorldRun:
    """A kept runtime run (``--keep``) read back from its directory."""
    rows, log = _read(root / "state")
    started = float((root / "load_started").read_text())
    return _runtime_result(
        rows, log, root / "requests.csv", started, 0.0, exact_offset=exact_offset,
        tick0=first_tick(root / "state"),
    )  # fmt: skip


def first_tick(state: Path) -> float | None:
    """Unix time of the first round of the run in ``state`` (its recording's first
    TICK step; its rounds' grid starts there); None without one."""
    from deepboot.scheduler.events import EventKind
    from deepboot.world.recording import StepRecord, read_recording

    try:
        for record in read_recording(StateDir.at(state).recording):
            if isinstance(record, StepRecord) and record.event.kind is EventKind.TICK:
                return record.snapshot.now
    except ValueError:  # no recording
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=3, help="runs of each world (>= 1; default 3)")
    ap.add_argument(
        "--work-scale",
        type=float,
        default=1.0,
        help="multiply every job's steps (0.3: a smoke test; the table is for 1.0)",
    )
    ap.add_argument("--out", type=Path, help="also write the table and every run as JSON")
    ap.add_argument(
        "--keep", type=Path, help="keep the runtime runs here (DIR/run1, ...), for --resim"
    )
    ap.add_argument(
        "--resim",
        type=Path,
        help="no runtime: re-simulate the runs kept in this --keep directory (same --work-scale)",
    )
    ap.add_argument(
        "--sensitivity",
        type=int,
        default=0,
        metavar="N",
        help="also re-simulate each run N times with every pause moved by up to --jitter "
        "seconds: how far the simulator is from itself under timing noise (0: off)",
    )
    ap.add_argument(
        "--jitter", type=float, default=0.25, help="seconds of --sensitivity (default 0.25)"
    )
    ap.add_argument(
        "--restart-delay",
        type=float,
        default=None,
        help=f"the deepboot policy's restart_delay in both worlds (default "
        f"{POLICY_PARAMS['restart_delay']}); with --resim: what the simulator would have "
        "done at another one on the kept runs' measurements",
    )
    ap.add_argument(
        "--command-job",
        choices=[name for name, _, _ in JOBS],
        help="run this job as a command job (the same work as a plain torchrun script, "
        "bench/twin_command_job.py, resized by restart) in both worlds",
    )
    args = ap.parse_args(argv)
    if args.sensitivity < 0 or not args.jitter > 0:
        ap.error("--sensitivity must be >= 0 and --jitter > 0")
    if args.restart_delay is not None and not args.restart_delay > 0:
        ap.error("--restart-delay must be > 0 seconds")
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    if not args.work_scale > 0:
        ap.error("--work-scale must be > 0")
    setup = TWIN
    if args.restart_delay is not None:
        params = {**POLICY_PARAMS, "restart_delay": args.restart_delay}
        setup = dataclasses.replace(TWIN, policy_params=tuple(params.items()))
    if args.command_job:
        setup = dataclasses.replace(setup, command_jobs=(args.command_job,))
    console = Console(width=160)
    started = time.monotonic()
    runs: list[Trio] = []
    with tempfile.TemporaryDirectory(prefix="deepboot-twin-") as tmp:
        root = args.keep or Path(tmp)
        kept = sorted(args.resim.glob("run*")) if args.resim else []
        if args.resim and not kept:
            ap.error(f"--resim: no run* directories in {args.resim}")
        for i in range(len(kept) if kept else args.runs):
            if kept:
                rt = _resim(kept[i])
            else:
                console.print(f"runtime run {i + 1}/{args.runs}")
                rt = runtime_run(root / f"run{i + 1}", args.work_scale, console, setup)
            sim = sim_run(rt, args.work_scale, setup=setup)
            ref = sim_run(rt, args.work_scale, reference=True, setup=setup)
            console.print(
                "  JCT runtime / sim / ref. rules: "
                + ", ".join(
                    f"{n} {_fmt(rt.jct(n))}/{_fmt(sim.jct(n))}/{_fmt(ref.jct(n))}"
                    for n, _, _ in JOBS
                )
            )
            runs.append((rt, sim, ref))
    doc = report(runs, console)
    if args.sensitivity:
        doc["sensitivity"] = sensitivity(
            runs, args.work_scale, args.sensitivity, args.jitter, console, setup
        )
    doc["wall_s"] = time.monotonic() - started
    console.print(f"wall time {doc['wall_s']:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
