"""The runtime's controller: the control loop in real time, on a Ray cluster.

One process per cluster (``deepboot up`` starts it; ``python -m
deepboot.runtime.controller --state-dir DIR`` runs it by hand). Each iteration:

1. poll every worker (status, progress, timings, gradient statistics); a worker
   that died shrinks its job (the survivors re-form from their own state), a
   generation whose members have all formed completes its resize, a job whose
   workers are all done finishes;
2. take new submissions and cancellations from the store;
3. run the control loop (``scheduler.control``) for each event and for the
   periodic tick, through :class:`RayBackend`, which turns every job's new GPU set
   into a new generation of workers (AFE by default, restart with ``afe=False``);
4. write jobs, GPUs and the event log to the store, in one transaction.

It holds no scheduling logic: which job gets which GPU is the control loop's.
After a SIGKILL, a new controller rebuilds its picture from the store and from the
worker actors still alive (they are detached), kills strays, and goes on.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.gpu import GpuId, GpuState
from deepboot.elastic.protocol import (
    Generation,
    Restore,
    WorkerConfig,
    WorkerReport,
    WorkerStatus,
)
from deepboot.policies import registry
from deepboot.runtime.actors import ActorName, RayActors, actor_name
from deepboot.runtime.raycluster import ClusterRecord, ray_env
from deepboot.runtime.statedir import StateDir
from deepboot.runtime.store import JobRow, JobState, JobStore, LogKind
from deepboot.runtime.world import (
    GpuRec,
    JobRec,
    OnlineModel,
    Transition,
    cluster_gpus,
    gpu_name,
    parse_gpu,
)
from deepboot.scheduler.control import ControlLoop, LoopSettings, Snapshot, Step, run_event
from deepboot.scheduler.events import Event, EventKind
from deepboot.scheduler.loop import Scheduler
from deepboot.scheduler.operations import Bind, EvictReplica, Lend, Release

log = logging.getLogger("deepboot.controller")


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """The controller's knobs (``deepboot up`` flags; saved in controller.json).

    Attributes:
        policy: Training policy (one that needs no oracle; see ``deepboot up --help``).
        afe: Keep-alive resizes (False: checkpoint-restart resizes, the baseline).
        interval: Seconds between scheduling rounds.
        poll: Seconds between polls of the workers.
        collective_timeout: Seconds before a hung collective or rendezvous fails.
        lending: Training may borrow idle inference-pool GPUs.
        seed: Seed of the policies' randomness.
        params: The training policy's parameters (as ``deepboot policies`` lists).
    """

    policy: str = "deepboot"
    afe: bool = True
    interval: float = 60.0
    poll: float = 1.0
    collective_timeout: float = 60.0
    lending: bool = True
    seed: int = 0
    params: dict[str, str] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> ControllerSettings:
        return cls(**json.loads(path.read_text()))


def settings_file(state: StateDir) -> Path:
    return state.root / "controller.json"


class RayBackend:
    """The control loop's second world: jobs and GPUs on a Ray cluster.

    ``snapshot`` reports the world as the loop sees it; ``apply`` records the GPU
    operations and hands every job whose GPU set changed to the controller, which
    starts its next generation.
    """

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def snapshot(self, event: Event) -> Snapshot:
        ctl = self.ctl
        jobs = tuple(
            j.view(ctl.gpus)
            for j in sorted(ctl.jobs.values(), key=lambda j: (j.row.submitted, j.name))
            if j.active
        )
        gpus = tuple(ctl.gpus[g].view() for g in sorted(ctl.gpus))
        return Snapshot(ctl.clock(), ctl.cluster, jobs, gpus)

    def apply(self, step: Step) -> None:
        ctl = self.ctl
        touched: list[str] = []
        for op in step.ops:
            if isinstance(op, Bind | Lend):
                rec = ctl.gpus[op.gpu]
                rec.state = GpuState.TRAINING if isinstance(op, Bind) else GpuState.LENT
                rec.job = op.job
                touched.append(op.job)
                ctl.log_gpu(op.gpu, "bind" if isinstance(op, Bind) else "lend", op.job)
            elif isinstance(op, Release):
                rec = ctl.gpus[op.gpu]
                rec.state, rec.job = GpuState.FREE, None
                touched.append(op.job)
                ctl.log_gpu(op.gpu, "release", op.job)
            elif isinstance(op, EvictReplica):
                ctl.gpus[op.gpu].state = GpuState.FREE
            # Start/Resize/Preempt restate the GPU operations above at the job level.
        for job in dict.fromkeys(touched):
            ctl.retarget(ctl.jobs[job])


class Controller:
    """See the module docstring.

    Args:
        state: The state directory.
        settings: The knobs.
        actors: The Ray side (None: build one on the connected cluster).
        clock: Wall clock (injected for tests of the bookkeeping).
    """

    def __init__(
        self,
        state: StateDir,
        settings: ControllerSettings,
        cluster: ClusterSpec,
        actors: RayActors,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.settings = settings
        self.cluster = cluster
        self.actors = actors
        self.clock = clock
        self.store = JobStore(state.db)
        self.gpus: dict[GpuId, GpuRec] = cluster_gpus(cluster)
        self.jobs: dict[str, JobRec] = {}
        self.rng = np.random.default_rng(settings.seed)
        policy = registry.create(settings.policy, **settings.params)
        self.loop = ControlLoop(
            Scheduler(policy),
            None,
            LoopSettings(interval=settings.interval, lending=settings.lending),
        )
        self.backend = RayBackend(self)
        self._pending_log: list[tuple[LogKind, str, dict[str, Any]]] = []
        self._next_tick = 0.0
        self._last = clock()
        self._stop = False

    # -- logging into the store (flushed with the state it describes) ------------------------

    def note(self, kind: LogKind, job: str = "", **detail: Any) -> None:
        self._pending_log.append((kind, job, detail))

    def log_gpu(self, gpu: GpuId, op: str, job: str) -> None:
        self.note(LogKind.GPU, job, gpu=gpu_name(gpu), op=op)

    def flush(self) -> None:
        with self.store.transaction() as db:
            for kind, job, detail in self._pending_log:
                self.store.log(db, kind, job, **detail)
            self._pending_log.clear()
            for j in self.jobs.values():
                self.store.save_job(db, j.row)
            self.store.save_gpus(
                db,
                [
                    (gpu_name(g), g[0], g[1], r.pool.value, r.state.value, r.job or "")
                    for g, r in sorted(self.gpus.items())
                ],
            )
            self.store.set_meta(db, "heartbeat", repr(self.clock()))
            self.store.set_meta(db, "controller_pid", str(os.getpid()))
        # An ended job's last row is written: stop rewriting it every iteration.
        for name in [n for n, j in self.jobs.items() if j.row.state.ended]:
            del self.jobs[name]

    # -- start-up and reconciliation ----------------------------------------------------------

    def recover(self) -> None:
        """Rebuild the picture from the store and the live worker actors.

        A job keeps the live workers of its recorded generation; any other worker
        actor of the namespace (an ended job's, a superseded incarnation's) is killed,
        so a job never has two live worker groups. A job whose recorded workers are
        not all alive, or not all in its recorded generation, re-forms as a new
        generation of the survivors (or goes back to the queue, to restore its
        checkpoint, when none survived).
        """
        rows = {r.name: r for r in self.store.jobs()}
        live = [n for n in self.actors.list_workers() if ActorName.parse(n)]
        by_job: dict[str, dict[str, str]] = {}
        for name in live:
            parsed = ActorName.parse(name)
            assert parsed is not None
            by_job.setdefault(parsed.job, {})
            prev = by_job[parsed.job].get(parsed.gpu)
            if prev is not None:
                # Two incarnations on one GPU: the older one is a leftover.
                old, new = sorted([prev, name], key=lambda n: ActorName.parse(n).incarnation)  # type: ignore[union-attr]
                self.actors.kill(old)
                name = new
            by_job[parsed.job][parsed.gpu] = name
        killed: list[str] = []
        kept: list[str] = []
        recovered: list[str] = []
        for job_name, actors in by_job.items():
            row = rows.get(job_name)
            if row is None or row.state.ended:
                for name in actors.values():
                    self.actors.kill(name)
                    killed.append(name)
        for row in rows.values():
            if row.state.ended:
                continue
            rec = JobRec(row, model=OnlineModel.from_json(row.model))
            self.jobs[row.name] = rec
            if row.state is JobState.SUBMITTED:
                continue
            actors = by_job.get(row.name, {})
            for gpu, name in actors.items():
                if gpu not in row.workers:
                    self.actors.kill(name)
                    killed.append(name)
            members = [g for g in row.workers if g in actors]
            rec.actors = {g: actors[g] for g in members}
            kept.extend(rec.actors.values())
            reports = self.actors.reports(list(rec.actors.values()))
            alive = [g for g in members if reports.get(rec.actors[g]) is not None]
            for g in members:
                if g not in alive:
                    self.actors.kill(rec.actors.pop(g))
            for g in alive:
                rep = reports[rec.actors[g]]
                assert rep is not None
                rec.reports[g] = rep
                r = self.gpus[parse_gpu(g)]
                r.state = GpuState.TRAINING if r.pool is Pool.TRAINING else GpuState.LENT
                r.job = row.name
            rec.gen = Generation(
                row.generation,
                tuple(row.workers),
                self._store_path(row.name, row.generation),
                row.local_bsz,
                row.accum,
                self._num_nodes(row.workers),
                checkpoint_path=str(self.state.job_checkpoint(row.name)),
            )
            formed = all(
                rec.reports[g].generation == row.generation
                and rec.reports[g].status in (WorkerStatus.RUNNING, WorkerStatus.DONE)
                for g in alive
            )
            if alive and formed and len(alive) == len(row.workers):
                rec.formed = row.generation
            elif alive:
                # Order the survivors so that rank 0 holds the newest state.
                alive.sort(key=lambda g: (-rec.reports[g].generation, row.workers.index(g)))
                self._new_generation(rec, tuple(alive), how="failure", joiners=())
            else:
                rec.gen = None
                rec.update(state=JobState.QUEUED, workers=())
            recovered.append(row.name)
        self.note(LogKind.RECONCILED, kept=sorted(kept), killed=sorted(killed))
        self.note(
            LogKind.CONTROLLER_STARTED,
            policy=self.settings.policy,
            afe=self.settings.afe,
            recovered=recovered,
        )
        self.flush()

    # -- the loop ---------------------------------------------------------------------------

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Iterate until SIGTERM/SIGINT (or ``until()`` is true)."""
        self.recover()
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        while not self._stop and not (until and until()):
            started = time.monotonic()
            self.iteration()
            time.sleep(max(self.settings.poll - (time.monotonic() - started), 0.05))

    def request_stop(self) -> None:
        self._stop = True

    def iteration(self) -> None:
        now = self.clock()
        dt, self._last = max(now - self._last, 0.0), now
        events: list[Event] = []
        events += self.poll(dt)
        rows = self.store.jobs()  # one read of the store per iteration
        events += self.take_submissions(rows)
        events += self.take_cancellations(rows)
        if now >= self._next_tick:
            events.append(Event(EventKind.TICK))
            self._next_tick = now + self.settings.interval
        for event in events:
            run_event(self.loop, event, self.backend, self.rng)
        self.flush()

    def take_submissions(self, rows: list[JobRow]) -> list[Event]:
        events = []
        for row in rows:
            if row.state is JobState.SUBMITTED and row.name not in self.jobs:
                rec = JobRec(row)
                rec.update(state=JobState.QUEUED)
                self.jobs[row.name] = rec
                events.append(Event(EventKind.JOB_SUBMITTED, job=row.name))
            elif row.state is JobState.SUBMITTED:
                self.jobs[row.name].update(state=JobState.QUEUED)
        return events

    def take_cancellations(self, rows: list[JobRow]) -> list[Event]:
        events = []
        cancelled = {r.name for r in rows if r.cancel and not r.state.ended}
        for name in sorted(cancelled):
            rec = self.jobs.get(name)
            if rec is None:
                continue
            self._end(rec, JobState.CANCELLED)
            self.note(LogKind.CANCELLED, name)
            events.append(Event(EventKind.JOB_FINISHED, job=name))
        return events

    # -- polling workers --------------------------------------------------------------------

    def poll(self, dt: float) -> list[Event]:
        events: list[Event] = []
        for rec in list(self.jobs.values()):
            if not rec.active or not (rec.actors or rec.leaving):
                continue
            held = sum(1 for g in self.gpus.values() if g.job == rec.name)
            rec.update(attained=rec.row.attained + held * dt)
            reports = self.actors.reports([*rec.actors.values(), *rec.leaving])
            self._poll_leavers(rec, reports)
            by_gpu = {g: reports[n] for g, n in rec.actors.items() if n in reports}
            if self._poll_job(rec, by_gpu):
                events.append(Event(EventKind.JOB_FINISHED, job=rec.name))
        return events

    def _poll_leavers(self, rec: JobRec, reports: dict[str, WorkerReport | None]) -> None:
        for name in list(rec.leaving):
            if name not in reports:
                continue  # not scheduled yet or slow: ask again next time
            r = reports[name]
            if r is None or r.status in (
                WorkerStatus.DEPARTED,
                WorkerStatus.DONE,
                WorkerStatus.FAILED,
            ):
                self.actors.kill(name)
                del rec.leaving[name]
        if rec.gen is not None and rec.gen.stop and not rec.leaving and rec.transition:
            rec.transition = None  # a preemption's stop is complete

    def _poll_job(self, rec: JobRec, reports: dict[str, WorkerReport | None]) -> bool:
        """Digest one job's reports; True when the job ended."""
        dead = [g for g, r in reports.items() if r is None]
        for g, r in reports.items():
            if r is None:
                continue
            rec.reports[g] = r
            if r.measurements:
                rec.model.add(r.measurements)
            rec.model.note_grad(r)
            if r.status is WorkerStatus.FAILED:
                last = r.error.strip().splitlines()[-1] if r.error.strip() else "worker failed"
                self._end(rec, JobState.FAILED, message=last)
                self.note(LogKind.FAILED, rec.name, error=r.error[-2000:])
                return True
            if math.isfinite(r.loss) and r.step >= rec.row.step:
                rec.update(step=r.step, loss=r.loss)
        rec.update(model=rec.model.to_json())
        if dead:
            self._workers_died(rec, dead)
        members = rec.members
        if not members:
            return False
        reps = [rec.reports.get(g) for g in members]
        gen = rec.gen
        assert gen is not None
        if rec.transition is not None and any(
            r is not None and r.broken >= gen.number for r in reps
        ):
            # The generation could not form (a member came too late, or a collective
            # broke while forming): offer a fresh one to the same members.
            log.warning("%s: generation %d did not form; offering another", rec.name, gen.number)
            self._new_generation(rec, gen.members, how=rec.transition.how, joiners=(), retry=True)
            return False
        if rec.transition is not None and all(
            r is not None
            and r.generation == rec.gen.number  # type: ignore[union-attr]
            and r.status in (WorkerStatus.RUNNING, WorkerStatus.DONE)
            for r in reps
        ):
            self._formed(rec)
        if rec.transition is None and all(
            r is not None and r.status is WorkerStatus.DONE for r in reps
        ):
            r0 = rec.reports[members[0]]
            self.note(
                LogKind.FINISHED,
                rec.name,
                step=r0.step,
                loss=r0.loss,
                seconds=round(self.clock() - (rec.row.started or rec.row.submitted), 3),
            )
            rec.update(step=r0.step, loss=r0.loss)
            self._end(rec, JobState.FINISHED)
            return True
        return False

    def _formed(self, rec: JobRec) -> None:
        tr, gen = rec.transition, rec.gen
        assert tr is not None and gen is not None
        rec.formed = gen.number
        digests = {g: list(rec.reports[g].digests.get(gen.number, ("", ""))) for g in gen.members}
        restored = rec.reports[gen.members[0]].restored_step
        lost = max(tr.steps_before - restored, 0) if tr.how in ("failure", "restart") else 0
        detail = dict(
            generation=gen.number,
            workers=list(gen.members),
            local_bsz=gen.local_bsz,
            accum=gen.accum_steps,
        )
        if tr.how == "start":
            self.note(LogKind.STARTED, rec.name, **detail, digests=digests)
            if rec.row.started is None:
                rec.update(started=self.clock())
        else:
            self.note(
                LogKind.RESIZED,
                rec.name,
                **detail,
                how=tr.how,
                digests=digests,
                steps_lost=lost,
                seconds=round(self.clock() - tr.started, 3),
                **{"from": list(tr.old), "to": list(gen.members)},
            )
        rec.update(steps_lost=rec.row.steps_lost + lost)
        rec.transition = None

    def _workers_died(self, rec: JobRec, dead: list[str]) -> None:
        for g in dead:
            name = rec.actors.pop(g)
            self.actors.kill(name)
            rec.reports.pop(g, None)
            if g not in rec.members:
                continue  # a leaver: nothing lost
            self.note(
                LogKind.WORKER_FAILED,
                rec.name,
                worker=g,
                generation=rec.gen.number if rec.gen else 0,
                step=rec.row.step,
            )
            gpu = self.gpus[parse_gpu(g)]
            gpu.state, gpu.job = GpuState.FREE, None
            self.log_gpu(gpu.gpu, "release", rec.name)
        survivors = tuple(g for g in rec.members if g not in dead)
        if not any(g in rec.members for g in dead):
            return
        if survivors:
            self._new_generation(rec, survivors, how="failure", joiners=())
        else:
            # Nobody holds the state: back to the queue, to restore the checkpoint.
            rec.gen, rec.transition = None, None
            rec.update(state=JobState.QUEUED, workers=(), restarts=rec.row.restarts + 1)

    def _end(self, rec: JobRec, state: JobState, message: str = "") -> None:
        for name in [*rec.actors.values(), *rec.leaving]:
            self.actors.kill(name)
        rec.actors.clear()
        rec.leaving.clear()
        for g in self.gpus.values():
            if g.job == rec.name:
                self.log_gpu(g.gpu, "release", rec.name)
                g.state, g.job = GpuState.FREE, None
        rec.gen, rec.transition = None, None
        rec.update(state=state, finished=self.clock(), workers=(), message=message)

    # -- generations ----------------------------------------------------------------------------

    def retarget(self, rec: JobRec) -> None:
        """Start the generation that puts ``rec`` on the GPUs the loop gave it."""
        held = sorted(gpu_name(g.gpu) for g in self.gpus.values() if g.job == rec.name)
        old = rec.members
        if set(held) == set(old):
            return
        if not held:
            if rec.actors:
                self._stop_generation(rec, how="stop")
                self.note(LogKind.PREEMPTED, rec.name, generation=rec.formed, workers=list(old))
            rec.update(state=JobState.QUEUED, workers=())
            return
        survivors = tuple(g for g in old if g in held)
        joiners = tuple(g for g in held if g not in old)
        if not old:
            self._new_generation(rec, tuple(held), how="start", joiners=tuple(held))
        elif self.settings.afe and survivors:
            self._new_generation(rec, survivors + joiners, how="afe", joiners=joiners)
        else:
            self._stop_generation(rec, how="restart")
            self._new_generation(rec, tuple(held), how="restart", joiners=tuple(held))

    def _stop_generation(self, rec: JobRec, how: str) -> None:
        gen = rec.gen
        assert gen is not None
        stop = Generation(
            gen.number + 1,
            gen.members,
            "",
            gen.local_bsz,
            gen.accum_steps,
            gen.num_nodes,
            checkpoint_path=str(self.state.job_checkpoint(rec.name)),
            stop=True,
        )
        for g, name in rec.actors.items():
            self.actors.offer(name, stop)
            rec.leaving[name] = g
        rec.actors.clear()
        rec.gen = stop
        rec.transition = Transition(how, stop.number, self.clock(), gen.members, rec.row.step)
        rec.update(generation=stop.number)

    def _new_generation(
        self,
        rec: JobRec,
        members: tuple[str, ...],
        how: str,
        joiners: tuple[str, ...],
        retry: bool = False,
    ) -> None:
        """Offer the next generation of ``rec`` to its workers and start the joiners'.

        ``retry``: the pending generation could not form; the new one continues the
        same resize (its event reports the whole resize, from its first offer).
        """
        prev = rec.gen
        pending = rec.transition
        number = (prev.number if prev else rec.row.generation) + 1
        nodes = self._num_nodes(members)
        local_bsz, accum = rec.batch_for(nodes, len(members))
        ckpt = self.state.job_checkpoint(rec.name)
        fresh_start = how in ("start", "restart")
        restore = Restore.CHECKPOINT if fresh_start and ckpt.exists() else Restore.MEMORY
        if how == "restart":
            restore = Restore.CHECKPOINT
        gen = Generation(
            number,
            members,
            self._store_path(rec.name, number),
            local_bsz,
            accum,
            nodes,
            restore=restore,
            checkpoint_path=str(ckpt),
            after_generation=(prev.number if (prev and prev.stop) else 0),
        )
        (self.state.rendezvous / rec.name).mkdir(parents=True, exist_ok=True)
        # A file store must start empty: stale addresses make gloo connect to nothing.
        Path(gen.store_path).unlink(missing_ok=True)
        old = prev.members if prev and not prev.stop else ()
        if retry and pending is not None:
            rec.transition = Transition(
                pending.how, number, pending.started, pending.old, pending.steps_before
            )
        else:
            rec.transition = Transition(
                how if not (how == "start" and rec.row.started) else "restart",
                number,
                self.clock(),
                old or (prev.members if prev else ()),
                rec.row.step,
            )
        rec.gen = gen
        rec.update(
            state=JobState.RUNNING,
            generation=number,
            workers=members,
            local_bsz=local_bsz,
            accum=accum,
            restarts=rec.row.restarts + (0 if how == "start" or retry else 1),
        )
        # Durable intent before any actor starts: a restarted controller finds it.
        self.flush()
        for g, name in list(rec.actors.items()):
            self.actors.offer(name, gen)
            if g not in members:
                rec.leaving[name] = g
                del rec.actors[g]
        spec = rec.row.spec
        config = WorkerConfig(
            rec.name,
            spec.entry,
            spec.args,
            str(self.state.job_log(rec.name)),
            self.settings.collective_timeout,
            spec.checkpoint_every,
        )
        for g in joiners:
            name = actor_name(rec.name, g, self._next_incarnation(rec))
            self.actors.create(name, config, g, gen)
            rec.actors[g] = name

    def _next_incarnation(self, rec: JobRec) -> int:
        key = f"incarnation:{rec.name}"
        value = int(self.store.meta(key, "0")) + 1
        with self.store.transaction() as db:
            self.store.set_meta(db, key, str(value))
        return value

    def _store_path(self, job: str, number: int) -> str:
        return str(self.state.rendezvous / job / f"gen-{number}")

    def _num_nodes(self, members: tuple[str, ...] | list[str]) -> int:
        return len({parse_gpu(g)[0] for g in members}) or 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deepboot.runtime.controller")
    parser.add_argument("--state-dir", default=".deepboot")
    args = parser.parse_args(argv)
    state = StateDir.at(args.state_dir)
    record = ClusterRecord.load(state)
    settings = ControllerSettings.load(settings_file(state))
    os.environ.update(ray_env(record))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    import ray

    ray.init(
        address=record.address,
        namespace="deepboot",
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    ctl = Controller(state, settings, record.cluster, RayActors())
    state.controller_pid.write_text(str(os.getpid()))
    try:
        ctl.run()
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
