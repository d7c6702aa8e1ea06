"""The runtime controller in-process, with fake actors (``fake_actors.py``): a real
:class:`~deepboot.runtime.controller_process.Controller` on a real SQLite store in a temporary
state directory, whose workers are in memory. Table by table: which generation each
change of a job's GPUs starts (who is created, offered, told to leave), a worker's
death decided by the control loop, and a recovery from the store and the live
actors. No Ray, no processes: the fast suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepboot.core.cluster import ClusterSpec
from deepboot.core.placement import EMPTY, Placement
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.controller.controller_settings import ControllerSettings
from deepboot.runtime.controller.jobrecords import JobRec, gpu_name, parse_gpu
from deepboot.runtime.controller.wiring import Controller
from deepboot.runtime.store.jobstore import JobState, LogKind
from deepboot.runtime.store.statedir import StateDir
from deepboot.scheduler.control import Step
from deepboot.scheduler.decision import Preempt, Resize, Start
from deepboot.scheduler.events import EventKind
from deepboot.scheduler.operations import AnyOperation, Bind, Release
from deepboot.world.settings import SharedCluster
from tests.runtime.fake_actors import FakeActors


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def controller(
    tmp_path: Path,
    policy: str = "deepboot",
    afe: bool = True,
    actors: FakeActors | None = None,
    keep_events: int = 1_000_000,
) -> tuple[Controller, FakeActors]:
    fake = actors if actors is not None else FakeActors()
    settings = ControllerSettings(
        policy=policy, shared=SharedCluster(afe=afe), keep_events=keep_events
    )
    state = StateDir.at(tmp_path / "state").ensure()
    ctl = Controller(state, settings, ClusterSpec.parse("1x4"), fake, clock=Clock())
    return ctl, fake


def submit(ctl: Controller, name: str = "j", **spec: int) -> JobRec:
    """Submit through the store and the controller's intake."""
    ctl.store.submit(JobSpec(name, "m:f", **spec))
    ctl.intake.iteration()
    ctl.driver.run_due()  # JOB_SUBMITTED: nothing before the next tick
    return ctl.jobs[name]


def move(ctl: Controller, job: str, gpus: tuple[str, ...], round: bool = False) -> None:
    """Apply the step that puts ``job`` on ``gpus`` (GPU operations, then the job's)."""
    held = {gpu_name(g.gpu_id) for g in ctl.board.held(job)}
    ops: list[AnyOperation] = [Release(parse_gpu(g), job) for g in sorted(held - set(gpus))]
    ops += [Bind(parse_gpu(g), job) for g in sorted(set(gpus) - held)]
    old = Placement.of(g.node_id for g in ctl.board.held(job)) if held else EMPTY
    new = Placement.of(parse_gpu(g)[0] for g in gpus) if gpus else EMPTY
    if not held:
        ops.append(Start(job, new))
    elif not gpus:
        ops.append(Preempt(job, old))
    elif held != set(gpus):
        ops.append(Resize(job, old, new))
    ctl.backend.apply(Step(ops=tuple(ops), round=round))


def settle(ctl: Controller) -> None:
    """Poll until the job's generation formed (the fake workers obey at once), then
    once more (leavers report DEPARTED and are killed)."""
    for _ in range(3):
        ctl.polling.poll(0.1)
    ctl.flush()


def events(ctl: Controller, kind: LogKind) -> list[dict[str, object]]:
    return [e.detail for e in ctl.store.events() if e.kind is kind]


# -- generations, change by change --------------------------------------------------------


@pytest.mark.parametrize(
    ("afe", "before", "after", "how", "joiners", "leavers"),
    [
        (True, ("0.0",), ("0.0", "0.1"), "afe", ("0.1",), ()),
        (True, ("0.0", "0.1", "0.2"), ("0.1",), "afe", (), ("0.0", "0.2")),
        (True, ("0.0", "0.1"), ("0.2", "0.3"), "restart", ("0.2", "0.3"), ("0.0", "0.1")),
        (False, ("0.0",), ("0.0", "0.1"), "restart", ("0.0", "0.1"), ("0.0",)),
    ],
    ids=["grow-afe", "shrink-afe", "moved-restart", "grow-no-afe"],
)
def test_each_change_of_a_jobs_gpus_starts_its_generation(
    tmp_path: Path,
    afe: bool,
    before: tuple[str, ...],
    after: tuple[str, ...],
    how: str,
    joiners: tuple[str, ...],
    leavers: tuple[str, ...],
) -> None:
    ctl, fake = controller(tmp_path, afe=afe)
    rec = submit(ctl)
    move(ctl, "j", before)
    first = {g for _, g, _ in fake.created}
    assert first == set(before) and rec.transition is not None
    settle(ctl)
    assert rec.transition is None and len(events(ctl, LogKind.STARTED)) == 1
    old = fake.live("j")
    fake.created.clear()
    move(ctl, "j", after)
    assert sorted(g for _, g, _ in fake.created) == sorted(joiners)
    settle(ctl)
    [resized] = events(ctl, LogKind.RESIZED)
    assert resized["how"] == how and sorted(resized["to"]) == sorted(after)  # type: ignore[arg-type]
    assert sorted(old[g] for g in leavers) == sorted(fake.killed)
    assert set(fake.live("j")) == set(after) and rec.row.state is JobState.RUNNING
    # Survivors' rank first: rank 0 holds the state the joiners copy.
    if how == "afe":
        assert rec.members[0] in before


def test_a_preempted_job_stops_its_workers_and_waits(tmp_path: Path) -> None:
    ctl, fake = controller(tmp_path)
    rec = submit(ctl)
    move(ctl, "j", ("0.0", "0.1"))
    settle(ctl)
    workers = set(fake.live("j").values())
    move(ctl, "j", ())
    assert rec.row.state is JobState.QUEUED and rec.gen is not None and rec.gen.stop
    settle(ctl)
    assert set(fake.killed) == workers and not fake.live("j")
    assert len(events(ctl, LogKind.PREEMPTED)) == 1


def _write_checkpoint(ctl: Controller, job: str, generation: int) -> None:
    """What a departing rank 0 writes (the fake workers write nothing)."""
    path = ctl.state.job_checkpoint(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(generation.to_bytes(8, "little") + b"state")


def test_a_restart_waits_for_the_checkpoint_its_stopped_generation_writes(
    tmp_path: Path,
) -> None:
    ctl, fake = controller(tmp_path)
    rec = submit(ctl)
    move(ctl, "j", ("0.0",))
    settle(ctl)
    fake.deaf.add(fake.live("j")["0.0"])  # still checkpointing when the job restarts
    move(ctl, "j", ())
    move(ctl, "j", ("0.1",))
    assert rec.gen is not None and rec.gen.after_generation == 2  # the stop's
    _write_checkpoint(ctl, "j", 2)
    move(ctl, "j", ())
    move(ctl, "j", ("0.2",))
    assert rec.gen is not None and rec.gen.number == 5
    assert rec.gen.after_generation == 0  # generation 3 never formed: nothing newer comes


def test_a_restart_does_not_wait_for_a_checkpoint_its_killed_leaver_never_wrote(
    tmp_path: Path,
) -> None:
    ctl, fake = controller(tmp_path)
    rec = submit(ctl)
    move(ctl, "j", ("0.0",))
    settle(ctl)
    _write_checkpoint(ctl, "j", 1)  # a periodic one of generation 1
    stubborn = fake.live("j")["0.0"]
    fake.deaf.add(stubborn)
    move(ctl, "j", ())  # stop: generation 2
    ctl.clock.t += ctl.settings.leave_timeout + 1.0  # type: ignore[attr-defined]
    ctl.polling.poll(0.1)
    assert stubborn in fake.killed and not rec.leaving  # killed before it wrote
    move(ctl, "j", ("0.1",))
    assert rec.gen is not None and rec.gen.after_generation == 0  # generation 1's, as is
    settle(ctl)  # generation 3 forms
    move(ctl, "j", ())  # stop: generation 4
    settle(ctl)  # its worker departs, having written (as a real rank 0 does):
    _write_checkpoint(ctl, "j", 4)
    move(ctl, "j", ("0.2",))
    assert rec.gen is not None and rec.gen.after_generation == 4


def test_a_job_done_while_it_grows_finishes_without_waiting_for_its_joiners(
    tmp_path: Path,
) -> None:
    """The grow was decided at its last step: the survivor's function returned (DONE)
    and never joins, the joiner waits for it; the job has finished all the same."""
    ctl, fake = controller(tmp_path)
    rec = submit(ctl)
    move(ctl, "j", ("0.0",))
    settle(ctl)
    fake.work["j"] = fake.progress.get("j", 10)  # its last step is done
    fake.silent.add("w|j|0.1|2")  # the joiner is still starting
    move(ctl, "j", ("0.0", "0.1"))
    assert rec.transition is not None
    ctl.polling.poll(0.1)
    assert rec.row.state is JobState.FINISHED  # not after the form timeout
    assert "w|j|0.1|2" in fake.killed and not ctl.board.held("j")
    assert len(events(ctl, LogKind.FINISHED)) == 1


def test_gpus_moved_without_the_jobs_operation_are_refused(tmp_path: Path) -> None:
    from deepboot.core.errors import InvalidDecisionError

    ctl, _ = controller(tmp_path)
    submit(ctl)
    with pytest.raises(InvalidDecisionError, match="no Start, Resize or Preempt"):
        ctl.backend.apply(Step(ops=(Bind((0, 0), "j"),)))


def test_a_leaver_that_ignores_its_stop_is_killed_after_the_deadline(tmp_path: Path) -> None:
    ctl, fake = controller(tmp_path)
    rec = submit(ctl)
    move(ctl, "j", ("0.0", "0.1"))
    settle(ctl)
    stubborn = fake.live("j")["0.1"]
    fake.deaf.add(stubborn)  # it never hears of the next generation
    move(ctl, "j", ("0.0",))
    settle(ctl)
    assert rec.members == ("0.0",) and rec.transition is None  # the survivor went on
    assert stubborn in rec.leaving and stubborn not in fake.killed
    ctl.clock.t += ctl.settings.leave_timeout - 1.0  # type: ignore[attr-defined]
    ctl.polling.poll(0.1)
    assert stubborn not in fake.killed
    ctl.clock.t += 2.0  # type: ignore[attr-defined]
    ctl.polling.poll(0.1)
    assert stubborn in fake.killed and not rec.leaving


def test_a_generation_that_never_forms_is_given_up_and_the_loop_replans(
    tmp_path: Path,
) -> None:
    ctl, fake = controller(tmp_path)
    rec = submit(ctl)
    move(ctl, "j", ("0.0",))
    settle(ctl)
    fake.silent.add("w|j|0.1|2")  # the joiner's actor never gets scheduled
    move(ctl, "j", ("0.0", "0.1"))
    assert fake.created[-1][0] == "w|j|0.1|2"
    ctl.clock.t += ctl.settings.form_timeout - 1.0  # type: ignore[attr-defined]
    settle(ctl)
    assert rec.transition is not None and not rec.lost  # still waiting
    ctl.clock.t += 2.0  # type: ignore[attr-defined]
    ctl.polling.poll(0.1)
    assert "w|j|0.1|2" in fake.killed and rec.lost == ("0.1",)
    assert {gpu_name(g.gpu_id) for g in ctl.board.held("j")} == {"0.0"}
    assert ctl.driver.queue.pop()[1].kind is EventKind.WORKER_LOST
    move(ctl, "j", ("0.0",), round=True)  # the round keeps the job on its survivor
    settle(ctl)
    assert rec.transition is None and rec.members == ("0.0",)
    [resized] = events(ctl, LogKind.RESIZED)
    assert resized["how"] == "failure" and resized["to"] == ["0.0"]


def test_a_generation_is_offered_again_only_once_every_member_gave_it_up(
    tmp_path: Path,
) -> None:
    ctl, fake = controller(tmp_path)
    rec = submit(ctl)
    move(ctl, "j", ("0.0", "0.1"))
    workers = fake.live("j")
    first = rec.gen.number  # type: ignore[union-attr]
    fake.broken[workers["0.1"]] = first  # rank 1 gives the rendezvous up first
    ctl.polling.poll(0.1)
    assert rec.gen.number == first  # type: ignore[union-attr]  # rank 0 still waits in it
    fake.broken[workers["0.0"]] = first
    ctl.polling.poll(0.1)
    assert rec.gen.number == first + 1  # type: ignore[union-attr]
    assert fake.offers(workers["0.0"])[-1] == first + 1
    fake.broken.clear()
    settle(ctl)
    assert rec.transition is None and len(events(ctl, LogKind.STARTED)) == 1


# -- a worker's death: facts by the poll, the decision by the loop ---------------------------


def kill_one(ctl: Controller, fake: FakeActors, gpu: str) -> None:
    fake.die(fake.live("j")[gpu])
    ctl.polling.poll(0.1)


@pytest.mark.parametrize(
    ("round_gives", "members", "joiners"),
    [
        # the round keeps the survivors where they stand: they re-form alone
        (("0.0", "0.2"), ("0.0", "0.2"), ()),
        # the round gives the dead worker's GPU back: a new worker joins them
        (("0.0", "0.1", "0.2"), ("0.0", "0.2", "0.1"), ("0.1",)),
    ],
    ids=["keep-survivors", "replace-the-dead"],
)
def test_a_dead_worker_waits_for_the_loops_round_then_the_survivors_reform(
    tmp_path: Path, round_gives: tuple[str, ...], members: tuple[str, ...], joiners: tuple[str, ...]
) -> None:
    ctl, fake = controller(tmp_path, afe=False)  # a failure is no resize: memory, even so
    rec = submit(ctl)
    move(ctl, "j", ("0.0", "0.1", "0.2"))
    settle(ctl)
    fake.created.clear()
    kill_one(ctl, fake, "0.1")
    # Facts only: the GPU is free, the loop is told, no generation is offered yet.
    assert {gpu_name(g.gpu_id) for g in ctl.board.held("j")} == {"0.0", "0.2"}
    assert rec.lost == ("0.1",) and len(ctl.driver.queue) == 1
    assert ctl.driver.queue.peek_time() == ctl.clock()
    offered = {n: fake.offers(n) for n in fake.live("j").values()}
    ctl.polling.poll(0.1)  # a poll before the loop ran changes nothing
    assert {n: fake.offers(n) for n in fake.live("j").values()} == offered
    assert ctl.driver.queue.pop()[1].kind is EventKind.WORKER_LOST
    move(ctl, "j", round_gives, round=True)  # as the loop's round on it would
    assert rec.lost == () and rec.members == members
    assert tuple(g for _, g, _ in fake.created) == joiners
    settle(ctl)
    [resized] = events(ctl, LogKind.RESIZED)
    assert resized["how"] == "failure" and resized["steps_lost"] == 0
    assert len(events(ctl, LogKind.WORKER_FAILED)) == 1


def test_the_policy_sizes_a_job_that_lost_a_worker_at_once(tmp_path: Path) -> None:
    # FIFO runs the job on the 2 GPUs it asks for: the round on the death puts it back
    # on 2 at once, rather than leaving it on the survivor until the next tick.
    ctl, fake = controller(tmp_path, policy="fifo")
    rec = submit(ctl, workers=2)
    move(ctl, "j", ("0.0", "0.1"))
    settle(ctl)
    kill_one(ctl, fake, "0.1")
    ctl.driver.run_due()
    assert len(rec.members) == 2 and "0.0" in rec.members and not rec.lost
    settle(ctl)
    [resized] = events(ctl, LogKind.RESIZED)
    assert resized["how"] == "failure" and len(fake.live("j")) == 2
    assert ctl.driver.rounds == 1


def test_a_job_whose_workers_all_died_goes_back_to_the_queue(tmp_path: Path) -> None:
    ctl, fake = controller(tmp_path)
    rec = submit(ctl)
    move(ctl, "j", ("0.0",))
    settle(ctl)
    kill_one(ctl, fake, "0.0")
    assert rec.row.state is JobState.QUEUED and rec.gen is None and rec.lost == ()
    assert rec.row.restarts == 1 and not ctl.board.held("j")


# -- recovery: the store's rows and the live actors ------------------------------------------


def test_a_new_controller_keeps_live_workers_and_reforms_after_a_death(tmp_path: Path) -> None:
    ctl, fake = controller(tmp_path)
    submit(ctl)
    move(ctl, "j", ("0.0", "0.1", "0.2"))
    settle(ctl)
    ctl.store.close()
    fake.die(fake.live("j")["0.2"])  # dies while no controller runs
    fresh, _ = controller(tmp_path, actors=fake)
    fresh.recovery.recover()
    rec = fresh.jobs["j"]
    assert rec.members == ("0.0", "0.1") and rec.transition is not None
    assert {gpu_name(g.gpu_id) for g in fresh.board.held("j")} == {"0.0", "0.1"}
    settle(fresh)
    [resized] = events(fresh, LogKind.RESIZED)
    assert resized["how"] == "failure"
    [reconciled] = events(fresh, LogKind.RECONCILED)
    assert len(reconciled["kept"]) == 2  # type: ignore[arg-type]


# -- the metrics' counts outlive the controller and the log's retention --------------------


def test_the_counts_go_on_across_controllers_after_retention_pruned_the_log(
    tmp_path: Path,
) -> None:
    ctl, fake = controller(tmp_path)
    submit(ctl)
    move(ctl, "j", ("0.0",))
    settle(ctl)
    move(ctl, "j", ("0.0", "0.1"))
    settle(ctl)
    assert ctl.metrics.counts() == {"resize:afe": 1}
    ctl.store.close()
    # A controller that keeps 2 entries: the resize's entry is pruned at its flush.
    second, _ = controller(tmp_path, actors=fake, keep_events=2)
    second.recovery.recover()
    assert second.metrics.counts() == {"resize:afe": 1}
    assert len(second.store.events()) == 2
    assert not [e for e in second.store.events() if e.kind is LogKind.RESIZED]
    second.store.close()
    third, _ = controller(tmp_path, actors=fake, keep_events=2)
    third.recovery.recover()
    assert third.metrics.counts() == {"resize:afe": 1}
