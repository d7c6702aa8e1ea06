"""Polling a job's workers: progress, timings and gradient statistics into the job's
online model; a generation that formed completes its resize; a job whose workers are
all done finishes; a worker that died frees its GPU (a failure in the ledger) and its
job waits for the control loop's round on the death, which says where it goes on
(its survivors then re-form from their own state)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from deepboot.elastic.protocol import WorkerReport, WorkerStatus
from deepboot.runtime.actors.handles import Actors
from deepboot.runtime.controller.controller_settings import ControllerSettings
from deepboot.runtime.controller.eventlog import EventLog
from deepboot.runtime.controller.faults import CrashPoints
from deepboot.runtime.controller.generations import Generations
from deepboot.runtime.controller.jobrecords import JobRec, parse_gpu
from deepboot.runtime.controller.shared import Flush, Post
from deepboot.runtime.store.jobstore import JobState, LogKind
from deepboot.scheduler.events import Event, EventKind
from deepboot.world.gpus import GpuBoard

log = logging.getLogger("deepboot.controller")

RETRY_BASE_S = 1.0
"""A command job's first restart after a failure waits this long; each next one
twice as long as the one before, up to :data:`RETRY_MAX_S`."""
RETRY_MAX_S = 60.0
FAILURE_TEXT_MAX = 4000
"""Most characters of a failed command job's message (every failed rank's tail)."""


def retry_backoff(failures: int) -> float:
    """Seconds before a command job's ``failures``-th restart after a failure."""
    return float(min(RETRY_BASE_S * 2 ** max(failures - 1, 0), RETRY_MAX_S))


class Polling:
    """The workers' reports, digested (see the module docstring).

    Args:
        jobs: The jobs not yet ended, by name (shared with the other parts).
        generations: Offers a fresh generation when one could not form.
        board: The GPU ledger (a dead worker's GPU is released on it).
        actors: The workers' processes.
        settings: The controller's settings (the leave and form timeouts).
        log: The event log.
        post: The driver's queue (WORKER_LOST).
        flush: Makes a job's end durable before its workers are killed.
        crash: The crash points.
        clock: Wall clock.
    """

    def __init__(
        self,
        jobs: dict[str, JobRec],
        generations: Generations,
        board: GpuBoard,
        actors: Actors,
        settings: ControllerSettings,
        log: EventLog,
        post: Post,
        flush: Flush,
        crash: CrashPoints,
        clock: Callable[[], float],
    ) -> None:
        self.jobs, self.generations, self.board, self.actors = jobs, generations, board, actors
        self.settings, self.log, self.post, self.flush = settings, log, post, flush
        self.crash, self.clock = crash, clock

    def poll(self, dt: float) -> list[Event]:
        events: list[Event] = []
        for rec in list(self.jobs.values()):
            if rec.active and rec.retry_at is not None:
                self._retry_due(rec)
            if not rec.active or not (rec.actors or rec.leaving):
                continue
            held = len(self.board.held(rec.name))
            rec.update(attained=rec.row.attained + held * dt)
            reports = self.actors.reports([*rec.actors.values(), *rec.leaving])
            self._poll_leavers(rec, reports)
            by_gpu = {g: reports[n] for g, n in rec.actors.items() if n in reports}
            if self._poll_job(rec, by_gpu):
                events.append(Event(EventKind.JOB_FINISHED, job=rec.name))
        return events

    def _poll_leavers(self, rec: JobRec, reports: dict[str, WorkerReport | None]) -> None:
        now = self.clock()
        for name in list(rec.leaving):
            overstayed = now - rec.leaving_since.get(name, now) > self.settings.leave_timeout
            r = reports.get(name)
            gone = name in reports and (
                r is None
                or r.status in (WorkerStatus.DEPARTED, WorkerStatus.DONE, WorkerStatus.FAILED)
            )
            if not (gone or overstayed):
                continue  # not scheduled yet, slow, or checkpointing: ask again next time
            if overstayed and not gone:
                log.warning("%s: worker %s did not leave in %.0f s; killed", rec.name, name,
                            self.settings.leave_timeout)  # fmt: skip
            self.actors.kill(name)
            del rec.leaving[name]
            rec.leaving_since.pop(name, None)
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
            if r.status is WorkerStatus.FAILED and rec.row.spec.command:
                return self._command_failed(rec, reports)
            if r.status is WorkerStatus.FAILED:
                last = r.error.strip().splitlines()[-1] if r.error.strip() else "worker failed"
                self.end(rec, JobState.FAILED, message=last)
                self.log.note(LogKind.FAILED, rec.name, error=r.error[-2000:])
                return True
            if math.isfinite(r.loss) and r.step >= rec.row.step:
                rec.update(step=r.step, loss=r.loss)
        self._restart_progress(rec, reports)
        rec.update(model=rec.model.to_json())
        if dead:
            self.workers_died(rec, dead)
        members = rec.members
        if not members or rec.lost:
            return False  # no group, or a broken one the loop has yet to move
        reps = [rec.reports.get(g) for g in members]
        gen = rec.gen
        assert gen is not None
        tr = rec.transition
        # The group that holds the job's state: the members once formed; while a new
        # generation forms, its survivors. When every one of them has returned from
        # the training function, the job is done, whatever is still forming: the
        # survivors of a resize decided at its last step never join (their function
        # returned), and the joiners waited for them until the form timeout.
        holders = members if tr is None else tuple(g for g in tr.old if g in members)
        if holders and all(_done(rec.reports.get(g)) for g in holders):
            self._finished(rec, rec.reports[holders[0]])
            return True
        if tr is not None and self.clock() - tr.started > self.settings.form_timeout:
            stuck = [g for g, r in zip(members, reps, strict=True) if not _formed(r, gen.number)]
            if stuck:
                # Given up: the members that never formed it count as dead, and the
                # loop re-plans the job (its round on WORKER_LOST).
                log.warning("%s: generation %d did not form in %.0f s; %s given up",
                            rec.name, gen.number, self.settings.form_timeout, stuck)  # fmt: skip
                self.workers_died(rec, stuck)
                return False
        if rec.transition is not None and all(
            r is not None and r.broken >= gen.number for r in reps
        ):
            # The generation could not form (a member came too late, or a collective
            # broke while forming): offer a fresh one to the same members, once every
            # one of them has given this one up. Offered at the first one's word, the
            # others (rank 0 waiting on the collective) still sat in the old rendezvous
            # and joined the new one a timeout late, every time: a livelock.
            log.warning("%s: generation %d did not form; offering another", rec.name, gen.number)
            self.generations.offer(rec, gen.members, how=rec.transition.how, joiners=(), retry=True)
            return False
        if rec.transition is not None and all(_formed(r, gen.number) for r in reps):
            self.generations.formed(rec)
        return False

    def _command_failed(self, rec: JobRec, reports: dict[str, WorkerReport | None]) -> bool:
        """A rank of command job ``rec`` exited non-zero: the whole group stops (a
        rank waiting on the dead one in a collective would wait for its timeout) and,
        within ``max_restarts``, starts again after a back-off; past it the job is
        FAILED with every failed rank's message. True when the job ended."""
        spec = rec.row.spec
        text = "\n\n".join(
            r.error.strip() or f"rank on {g} failed"
            for g, r in sorted(reports.items())
            if r is not None and r.status is WorkerStatus.FAILED
        )
        if rec.model.failures >= spec.max_restarts:
            summary = f"failed {rec.model.failures + 1} times (max_restarts = {spec.max_restarts})"
            self.end(rec, JobState.FAILED, message=f"{summary}:\n{text}"[-FAILURE_TEXT_MAX:])
            self.log.note(LogKind.FAILED, rec.name, error=text[-FAILURE_TEXT_MAX:])
            return True
        rec.model.failures += 1
        backoff = retry_backoff(rec.model.failures)
        self.log.note(
            LogKind.RETRYING,
            rec.name,
            failures=rec.model.failures,
            max_restarts=spec.max_restarts,
            backoff_s=backoff,
            error=text[-FAILURE_TEXT_MAX:],
        )
        log.warning("%s: a rank failed (%d of %d restarts); again in %.0f s", rec.name,
                    rec.model.failures, spec.max_restarts, backoff)  # fmt: skip
        first = text.splitlines()[0] if text else "a rank failed"
        rec.update(
            model=rec.model.to_json(),
            message=f"restart {rec.model.failures}/{spec.max_restarts} after: {first}",
        )
        if rec.actors:
            self.generations.stop(rec, how="restart")
        rec.retry_at = self.clock() + backoff
        return False

    def _retry_due(self, rec: JobRec) -> None:
        """Start a command job backing off after a failure once its back-off is over
        and its old group has left (on the GPUs it holds then; none: it queues)."""
        assert rec.retry_at is not None
        if rec.leaving or self.clock() < rec.retry_at:
            return
        rec.retry_at = None
        if self.board.held(rec.name):
            self.generations.retarget(rec)
        else:
            rec.gen, rec.transition = None, None
            rec.move(JobState.QUEUED, workers=())

    def _restart_progress(self, rec: JobRec, reports: dict[str, WorkerReport | None]) -> None:
        """A command job's start or restart ends at its rank 0's first progress: its
        cost, from the decision (a restart: the stop) to it, is measured (the policy's
        restart cost for the job)."""
        if rec.progress_pending is None or rec.gen is None or not rec.gen.members:
            return
        r0 = reports.get(rec.gen.members[0])
        if r0 is None or r0.generation != rec.gen.number or not math.isfinite(r0.progress_at):
            return
        since, how = rec.progress_pending
        seconds = max(r0.progress_at - since, 0.0)
        rec.progress_pending = None
        rec.model.note_resize_cost(seconds)
        self.log.note(
            LogKind.PROGRESSED,
            rec.name,
            generation=rec.gen.number,
            how=how,
            seconds=round(seconds, 3),
        )

    def _finished(self, rec: JobRec, r0: WorkerReport) -> None:
        """``rec``'s training function returned on every worker holding its state
        (``r0``: rank 0's report): record the end, then stop every worker."""
        self.log.note(
            LogKind.FINISHED,
            rec.name,
            step=r0.step,
            loss=r0.loss,
            seconds=round(self.clock() - (rec.row.started or rec.row.submitted), 3),
        )
        rec.update(step=r0.step, loss=r0.loss)
        self.end(rec, JobState.FINISHED)

    def workers_died(self, rec: JobRec, dead: list[str]) -> None:
        for g in dead:
            name = rec.actors.pop(g)
            self.actors.kill(name)
            rec.reports.pop(g, None)
            if g not in rec.members:
                continue  # a leaver: nothing lost
            self.log.note(
                LogKind.WORKER_FAILED,
                rec.name,
                worker=g,
                generation=rec.gen.number if rec.gen else 0,
                step=rec.row.step,
            )
            gpu = self.board.get(parse_gpu(g))
            if gpu.job == rec.name:
                self.board.fail(gpu)
                self.log.gpu(gpu.gpu_id, "release", rec.name)
        lost = tuple(g for g in rec.members if g in dead or g in rec.lost)
        if not lost:
            return
        # Facts only: the decision is the loop's. Its round on WORKER_LOST sizes the
        # job again (the survivors' GPUs, or others), and the backend re-forms the
        # survivors there (``Change.FAILURE``); a queued request may take a freed GPU.
        self.post(Event(EventKind.WORKER_LOST, job=rec.name))
        if len(lost) < len(rec.members):
            rec.lost = lost
        else:
            # Nobody holds the state: back to the queue, to restore the checkpoint.
            rec.gen, rec.transition, rec.lost = None, None, ()
            rec.move(JobState.QUEUED, workers=(), restarts=rec.row.restarts + 1)

    def end(self, rec: JobRec, state: JobState, message: str = "") -> None:
        """End ``rec``: the end is durable before its workers are killed, so a
        controller that dies in between finds the job ended (and kills the workers
        as an ended job's), never a running job whose workers died (which it would
        run again from its checkpoint)."""
        workers = [*rec.actors.values(), *rec.leaving]
        rec.actors.clear()
        rec.leaving.clear()
        rec.leaving_since.clear()
        for g in self.board.held(rec.name):
            self.log.gpu(g.gpu_id, "release", rec.name)
        self.board.release_job(rec.name)
        rec.gen, rec.transition, rec.lost = None, None, ()
        rec.move(state, finished=self.clock(), workers=(), message=message)
        self.flush()
        self.crash.hit("finish.recorded")
        for name in workers:
            self.actors.kill(name)


def _done(report: WorkerReport | None) -> bool:
    return report is not None and report.status is WorkerStatus.DONE


def _formed(report: WorkerReport | None, generation: int) -> bool:
    """Whether a member's report says it runs in ``generation`` (or has finished)."""
    return (
        report is not None
        and report.generation == generation
        and report.status in (WorkerStatus.RUNNING, WorkerStatus.DONE)
    )
