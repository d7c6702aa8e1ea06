"""A job's generations: which change of its workers a new GPU set means (a pure plan,
by a transition table), and carrying it out (offering the generation to the workers
that stay, starting the joiners, stopping the leavers).

A generation is the group of workers that trains together until the next change;
AFE keeps the survivors alive and lets the joiners copy their state; a restart stops
every worker and restores the checkpoint on the new set.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from deepboot.core.modes import JobMode
from deepboot.elastic.protocol import Generation, Restore, WorkerConfig, checkpoint_generation
from deepboot.runtime.actors.handles import Actors, actor_name
from deepboot.runtime.controller.controller_settings import ControllerSettings
from deepboot.runtime.controller.eventlog import EventLog
from deepboot.runtime.controller.faults import CrashPoints
from deepboot.runtime.controller.jobrecords import JobRec, Transition, gpu_name, parse_gpu
from deepboot.runtime.controller.shared import Flush, Incarnations
from deepboot.runtime.store.jobstore import JobState, LogKind
from deepboot.runtime.store.statedir import StateDir
from deepboot.world.gpus import GpuBoard


class Change(enum.Enum):
    """How a job's workers follow a change of its GPU set (the value names it in
    the event log and in ``Transition.how``)."""

    KEEP = "keep"  # the same GPUs: nothing to do
    PREEMPT = "stop"  # no GPU left: the workers checkpoint and stop; back to the queue
    START = "start"  # no worker yet: one starts on every GPU
    AFE = "afe"  # the survivors stay alive; the joiners copy their state
    FAILURE = "failure"  # a member died: the survivors re-form from their own state
    RESTART = "restart"  # every worker stops; all restart from the checkpoint


CHANGES: Mapping[tuple[bool, bool, bool, bool], Change] = MappingProxyType(
    {
        # (has live workers, holds GPUs, keep-alive: a live worker on a GPU still
        #  held, with AFE on or after a death, a member of its generation died)
        (False, False, False, False): Change.KEEP,
        (False, True, False, False): Change.START,
        (True, False, False, False): Change.PREEMPT,
        (True, False, False, True): Change.PREEMPT,
        (True, True, True, False): Change.AFE,
        (True, True, True, True): Change.FAILURE,
        (True, True, False, False): Change.RESTART,
        (True, True, False, True): Change.RESTART,
    }
)
"""The transition table of :func:`plan_generation` (the combinations missing cannot
happen: keep-alive needs a live worker on a GPU still held, and a job whose members
all died has no generation left to re-form: it starts again)."""


@dataclass(frozen=True, slots=True)
class GenerationPlan:
    """What a new GPU set means for a job's workers.

    Attributes:
        change: The kind of change.
        members: The new generation's workers (GPU names), survivors first (rank 0
            holds the state the joiners copy); empty for KEEP and PREEMPT.
        joiners: The members that need a new worker.
    """

    change: Change
    members: tuple[str, ...] = ()
    joiners: tuple[str, ...] = ()


def plan_generation(
    old: Sequence[str],
    held: Sequence[str],
    afe: bool,
    lost: bool = False,
    restart_only: bool = False,
) -> GenerationPlan:
    """The change that moves a job from workers on ``old`` to the GPUs ``held``.

    Args:
        old: The GPUs of its current generation's live members, in rank order.
        held: The GPUs the ledger says it holds now.
        afe: Keep-alive resizes are on.
        lost: A member of the current generation died (``old`` is the survivors):
            they cannot go on as they are, even on the same GPUs, and they keep
            their state in memory whether AFE is on or not (a failure is no resize).
        restart_only: The job's workers cannot keep their state across a change (a
            command job: the user's own script): every change with live workers is
            a restart, a member's death included.
    """
    if set(old) == set(held) and not lost:
        return GenerationPlan(Change.KEEP)
    survivors = tuple(g for g in old if g in held)
    keep_alive = (afe or lost) and bool(survivors) and not restart_only
    change = CHANGES[(bool(old), bool(held), keep_alive, lost and bool(old))]
    if change in (Change.AFE, Change.FAILURE):
        joiners = tuple(g for g in held if g not in old)
        return GenerationPlan(change, survivors + joiners, joiners)
    if change is Change.PREEMPT:
        return GenerationPlan(change)
    return GenerationPlan(change, tuple(held), tuple(held))


class Generations:
    """Carrying out a job's generations (see the module docstring).

    Args:
        state: The state directory (checkpoints, rendezvous files, job logs).
        settings: The controller's settings (AFE on or off, the collective timeout).
        job_mode: How the policy sizes a job's batch.
        board: The GPU ledger: which GPUs a job holds.
        actors: The workers' processes.
        log: The event log.
        flush: Makes an intent durable before a worker hears of it.
        crash: The crash points.
        incarnations: The actor names' counters.
        clock: Wall clock.
        reserved_gb: GB of a GPU ("node.index") that a sleeping inference server
            still holds there (its new worker is told: ``WorkerConfig.gpu_reserved_gb``).
    """

    def __init__(
        self,
        state: StateDir,
        settings: ControllerSettings,
        job_mode: JobMode,
        board: GpuBoard,
        actors: Actors,
        log: EventLog,
        flush: Flush,
        crash: CrashPoints,
        incarnations: Incarnations,
        clock: Callable[[], float],
        reserved_gb: Callable[[str], float] = lambda gpu: 0.0,
    ) -> None:
        self.state, self.settings, self.job_mode = state, settings, job_mode
        self.board, self.actors, self.log, self.flush = board, actors, log, flush
        self.crash, self.incarnations, self.clock = crash, incarnations, clock
        self.reserved_gb = reserved_gb

    def retarget(self, rec: JobRec) -> None:
        """Start the generation that puts ``rec`` on the GPUs the ledger says it holds
        (:func:`plan_generation` says how)."""
        if rec.retry_at is not None:
            return  # a command job backing off after a failure: the poll starts it
        held = sorted(gpu_name(g.gpu_id) for g in self.board.held(rec.name))
        old = tuple(g for g in rec.members if g not in rec.lost)
        command = bool(rec.row.spec.command)
        plan = plan_generation(
            old, held, self.settings.afe and not command, lost=bool(rec.lost), restart_only=command
        )
        if plan.change is Change.KEEP:
            return
        if plan.change is Change.PREEMPT:
            if rec.actors:
                self.log.note(LogKind.PREEMPTED, rec.name, generation=rec.formed, workers=list(old))
                self.stop(rec, how=Change.PREEMPT.value)
            else:
                rec.move(JobState.QUEUED, workers=())
            return
        if plan.change is Change.RESTART:
            self.stop(rec, how=Change.RESTART.value)
        self.offer(rec, plan.members, how=plan.change.value, joiners=plan.joiners)

    def stop(self, rec: JobRec, how: str) -> None:
        """Tell every worker of ``rec`` to checkpoint (rank 0) and leave. The stop is
        durable before any worker hears of it: a preempted job's row is QUEUED with
        no workers, a restarting one's names the stop's generation, so a controller
        that dies meanwhile never takes the departing workers for a live group."""
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
        leavers = dict(rec.actors)
        rec.actors.clear()
        rec.gen, rec.lost = stop, ()
        rec.transition = Transition(how, stop.number, self.clock(), gen.members, rec.row.step)
        if how == Change.PREEMPT.value:
            rec.move(JobState.QUEUED, generation=stop.number, workers=())
        else:
            rec.update(generation=stop.number)
        self.flush()  # the stop's intent, before any worker hears of it
        for g, name in leavers.items():
            self.actors.offer(name, stop)
            rec.leave(name, g, self.clock())
        self.crash.hit("preempt.stopped" if how == Change.PREEMPT.value else f"{how}.stopped")

    @staticmethod
    def _checkpoint_after(rec: JobRec, prev: Generation | None, ckpt: Path) -> int:
        """The generation whose checkpoint a new generation that restores one waits
        for (``Generation.after_generation``; 0: whatever the file holds, if any).

        After a stop of a generation that formed, the stop's: its rank 0 writes it on
        leaving. But once none of its leavers is left and the file holds an older one,
        rank 0 died or was killed first and nothing newer will come: the file's own
        (the steps since are lost). After a stop of a generation that never formed
        (a reclaim or a resize came while it formed), none of its members writes one
        (they leave without state): the file's own too. Otherwise 0. Waiting for a
        checkpoint that never comes stalled a job for the whole join timeout."""
        if prev is None or not prev.stop or rec.formed != prev.number - 1:
            return 0
        if rec.leaving or checkpoint_generation(str(ckpt)) >= prev.number:
            return prev.number
        return 0

    def offer(
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
        gen = self._next_generation(rec, members, how)
        rec.transition = self._next_transition(rec, gen.number, how, retry)
        rec.gen, rec.lost = gen, ()
        rec.move(
            JobState.RUNNING,
            generation=gen.number,
            workers=members,
            local_bsz=gen.local_bsz,
            accum=gen.accum_steps,
            restarts=rec.row.restarts + (0 if how == "start" or retry else 1),
        )
        # Durable intent before any actor starts: a restarted controller finds it.
        self.flush()
        self.crash.hit(f"{how}.recorded")
        self._tell_workers(rec, prev, gen)
        self.crash.hit(f"{how}.offered")
        self._start_joiners(rec, gen, how, joiners)

    def _next_generation(self, rec: JobRec, members: tuple[str, ...], how: str) -> Generation:
        """The generation after ``rec``'s current one on ``members``: its batch, how its
        members restore their state, and an empty rendezvous store."""
        prev = rec.gen
        number = (prev.number if prev else rec.row.generation) + 1
        nodes = num_nodes(members)
        local_bsz, accum = rec.batch_for(nodes, len(members), self.job_mode)
        ckpt = self.state.job_checkpoint(rec.name)
        fresh_start = how in ("start", "restart")
        restore = Restore.CHECKPOINT if fresh_start and ckpt.exists() else Restore.MEMORY
        if how == "restart":
            restore = Restore.CHECKPOINT
        gen = Generation(
            number,
            members,
            self.store_path(rec.name, number),
            local_bsz,
            accum,
            nodes,
            restore=restore,
            checkpoint_path=str(ckpt),
            after_generation=self._checkpoint_after(rec, prev, ckpt),
        )
        (self.state.rendezvous / rec.name).mkdir(parents=True, exist_ok=True)
        # A file store must start empty: stale addresses make gloo connect to nothing.
        Path(gen.store_path).unlink(missing_ok=True)
        return gen

    def _next_transition(self, rec: JobRec, number: int, how: str, retry: bool) -> Transition:
        """The resize that generation ``number`` carries out, as its event will report
        it (a retry or a replaced unformed generation continues the pending one)."""
        prev, pending = rec.gen, rec.transition
        if retry and pending is not None:
            started, old, steps = pending.started, pending.old, pending.steps_before
            return Transition(pending.how, number, started, old, steps)
        if pending is not None and prev is not None and not prev.stop:
            # The pending generation never formed (a reclaim came mid-resize): this one
            # replaces it, and the event reports the resize from the last formed group.
            kind = pending.how if pending.how in ("start", "restart") else how
            return Transition(kind, number, self.clock(), pending.old, rec.row.step)
        old = prev.members if prev and not prev.stop else ()
        return Transition(
            how if not (how == "start" and rec.row.started) else "restart",
            number,
            self.clock(),
            old or (prev.members if prev else ()),
            rec.row.step,
        )

    def _tell_workers(self, rec: JobRec, prev: Generation | None, gen: Generation) -> None:
        """Offer ``gen`` to ``rec``'s live workers; those not in it leave."""
        if prev is not None and not prev.stop:
            # Workers told to leave by an earlier, unformed generation may have heard
            # of this one from their peers: offer it, so they leave now rather than
            # after a collective timeout. (Not after a stop: they checkpoint first.)
            for name in rec.leaving:
                self.actors.offer(name, gen)
        for g, name in list(rec.actors.items()):
            self.actors.offer(name, gen)
            if g not in gen.members:
                rec.leave(name, g, self.clock())
                del rec.actors[g]

    def _start_joiners(
        self, rec: JobRec, gen: Generation, how: str, joiners: tuple[str, ...]
    ) -> None:
        """Start a worker on each of ``joiners``, each under a new incarnation's name."""
        config = self._worker_config(rec)
        for i, g in enumerate(joiners):
            name = actor_name(rec.name, g, self.incarnations.next(f"incarnation:{rec.name}"))
            held = self.reserved_gb(g)  # a sleeping server's leftover on that GPU
            worker = dataclasses.replace(config, gpu_reserved_gb=held) if held else config
            self.actors.create(name, worker, g, gen)
            rec.actors[g] = name
            if i == 0:
                self.crash.hit(f"{how}.joined")

    def _worker_config(self, rec: JobRec) -> WorkerConfig:
        """What ``rec``'s new workers run: its training function, or its command with
        the placeholders filled and torchrun's run id and restart counts."""
        spec = rec.row.spec
        log_path = str(self.state.job_log(rec.name))
        if not spec.command:
            return WorkerConfig(
                rec.name,
                spec.entry,
                spec.args,
                log_path,
                self.settings.collective_timeout,
                spec.checkpoint_every,
            )
        ckpt_dir = self.state.job_checkpoint(rec.name).parent
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        return WorkerConfig(
            rec.name,
            "",
            spec.args,
            log_path,
            self.settings.collective_timeout,
            command=spec.argv(str(ckpt_dir)),
            workdir=spec.workdir,
            env={
                "DEEPBOOT_JOB": rec.name,
                "DEEPBOOT_CHECKPOINT_DIR": str(ckpt_dir),
                "TORCHELASTIC_RUN_ID": rec.name,
                "TORCHELASTIC_RESTART_COUNT": str(rec.model.failures),
                "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
            },
            stop_grace_s=spec.stop_grace_s,
        )

    def formed(self, rec: JobRec) -> None:
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
            self.log.note(LogKind.STARTED, rec.name, **detail, digests=digests)
            if rec.row.started is None:
                rec.update(started=self.clock())
        else:
            self.log.note(
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
        if rec.row.spec.command:
            rec.progress_pending = (tr.started, tr.how)  # its cost ends at the first progress

    def store_path(self, job: str, number: int) -> str:
        return str(self.state.rendezvous / job / f"gen-{number}")


def num_nodes(members: tuple[str, ...] | list[str]) -> int:
    """How many nodes a generation's members span (at least 1)."""
    return len({parse_gpu(g)[0] for g in members}) or 1
