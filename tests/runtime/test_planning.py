"""The runtime's pure plans, table by table, in-process (no Ray, no processes): which
change of a job's workers a new GPU set means, and what a recovery keeps and kills
given the stored rows and the live actors (fake ones: names and reports)."""

from __future__ import annotations

import pytest

from deepboot.elastic.protocol import WorkerReport, WorkerStatus
from deepboot.runtime.actors.handles import actor_name
from deepboot.runtime.actors.replica_actor import replica_name, standby_name
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.controller.generations import CHANGES, Change, GenerationPlan, plan_generation
from deepboot.runtime.controller.recovery import JobPlan, Outcome, plan_recovery, plan_replicas
from deepboot.runtime.store.jobstore import GpuRow, JobRow, JobState

# -- generations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "held", "afe", "want"),
    # old: the live members, rank order; held: the job's GPUs after the step
    [
        ((), (), True, GenerationPlan(Change.KEEP)),
        (("0.0", "0.1"), ("0.1", "0.0"), True, GenerationPlan(Change.KEEP)),
        ((), ("0.0", "1.0"), True, GenerationPlan(Change.START, ("0.0", "1.0"), ("0.0", "1.0"))),
        (("0.0",), (), True, GenerationPlan(Change.PREEMPT)),
        (("0.0",), (), False, GenerationPlan(Change.PREEMPT)),
        # grow: the survivor first (rank 0 holds the state), the joiners after it
        (("0.1",), ("0.0", "0.1"), True, GenerationPlan(Change.AFE, ("0.1", "0.0"), ("0.0",))),
        # shrink (a reclaim): no joiner
        (("0.0", "2.0"), ("0.0",), True, GenerationPlan(Change.AFE, ("0.0",), ())),
        # moved entirely: nobody survives, so AFE cannot keep anyone alive
        (("0.0",), ("1.0",), True, GenerationPlan(Change.RESTART, ("1.0",), ("1.0",))),
        # without AFE every change restarts from the checkpoint
        (
            ("0.0",),
            ("0.0", "0.1"),
            False,
            GenerationPlan(Change.RESTART, ("0.0", "0.1"), ("0.0", "0.1")),
        ),
    ],  # fmt: skip
)
def test_a_new_gpu_set_means_one_change(
    old: tuple[str, ...], held: tuple[str, ...], afe: bool, want: GenerationPlan
) -> None:
    assert plan_generation(old, held, afe) == want


@pytest.mark.parametrize(
    ("old", "held", "afe", "want"),
    # old: the survivors of a generation a member of which died
    [
        # the round kept the survivors' GPUs: they re-form there, from memory
        (("0.0", "0.1"), ("0.0", "0.1"), True, GenerationPlan(Change.FAILURE, ("0.0", "0.1"))),
        # ... with AFE off too: a failure is no resize, the state is in memory
        (("0.1",), ("0.1",), False, GenerationPlan(Change.FAILURE, ("0.1",))),
        # the round gave the dead worker's GPU back: a new worker joins the survivors
        (("0.1",), ("0.0", "0.1"), True, GenerationPlan(Change.FAILURE, ("0.1", "0.0"), ("0.0",))),
        # the round moved the job off every survivor: the checkpoint, on the new GPUs
        (("0.1",), ("1.0",), True, GenerationPlan(Change.RESTART, ("1.0",), ("1.0",))),
        # the round preempted it
        (("0.1",), (), True, GenerationPlan(Change.PREEMPT)),
    ],  # fmt: skip
)
def test_after_a_death_the_survivors_never_stay_as_they_were(
    old: tuple[str, ...], held: tuple[str, ...], afe: bool, want: GenerationPlan
) -> None:
    assert plan_generation(old, held, afe, lost=True) == want


def test_the_transition_table_covers_every_possible_case() -> None:
    # keep-alive needs a live worker on a GPU still held, and a death with no live
    # worker left is no generation to re-form (the job starts again): no other keys
    flags = (False, True)
    possible = {(o, h, k, lost) for o in flags for h in flags for k in flags for lost in flags
                if not (k and not (o and h)) and not (lost and not o)}  # fmt: skip
    assert set(CHANGES) == possible


# -- recovery ---------------------------------------------------------------------------


def row(name: str, state: JobState, workers: tuple[str, ...] = (), gen: int = 3) -> JobRow:
    spec = JobSpec(name, "train.py:train")
    return JobRow(name, spec, state, 0.0, generation=gen, workers=workers)


def report(gen: int, status: WorkerStatus = WorkerStatus.RUNNING) -> WorkerReport:
    return WorkerReport("0.0", status, gen, 0, float("nan"))


def test_a_job_whose_workers_all_live_in_its_generation_is_kept_as_formed() -> None:
    a, b = actor_name("j", "0.0", 1), actor_name("j", "0.1", 1)
    plan = plan_recovery(
        {"j": row("j", JobState.RUNNING, ("0.0", "0.1"))}, [a, b], {a: report(3), b: report(3)}
    )
    assert plan.kill == ()
    assert plan.jobs == (JobPlan("j", Outcome.FORMED, {"0.0": a, "0.1": b}),)


def test_survivors_reform_newest_state_first_and_the_dead_are_killed() -> None:
    a, b, c = (actor_name("j", g, 1) for g in ("0.0", "0.1", "1.0"))
    reports = {a: report(3), b: report(4), c: None}  # c died; b had formed generation 4
    plan = plan_recovery({"j": row("j", JobState.RUNNING, ("0.0", "0.1", "1.0"))}, [a, b, c],
                         reports)  # fmt: skip
    assert plan.kill == (c,)
    [job] = plan.jobs
    assert job.outcome is Outcome.REFORM and job.order == ("0.1", "0.0")


def test_a_job_with_no_live_worker_goes_back_to_the_queue() -> None:
    a = actor_name("j", "0.0", 1)
    plan = plan_recovery({"j": row("j", JobState.RUNNING, ("0.0",))}, [a], {})  # no answer
    assert plan.kill == (a,) and plan.jobs == (JobPlan("j", Outcome.REQUEUE),)


def test_a_worker_that_departed_is_dead_to_recovery() -> None:
    # A stop was offered (then the controller died): a departed worker's code ended;
    # it is no member to re-form, whatever generation it last named.
    a, b = actor_name("j", "0.0", 1), actor_name("j", "0.1", 1)
    reports = {a: report(4, WorkerStatus.DEPARTED), b: report(3)}
    plan = plan_recovery({"j": row("j", JobState.RUNNING, ("0.0", "0.1"))}, [a, b], reports)
    assert plan.kill == (a,)
    assert plan.jobs == (JobPlan("j", Outcome.REFORM, {"0.1": b}, ("0.1",)),)
    gone = plan_recovery({"j": row("j", JobState.RUNNING, ("0.0",))}, [a], reports)
    assert gone.kill == (a,) and gone.jobs == (JobPlan("j", Outcome.REQUEUE),)


def test_strays_are_killed_and_waiting_jobs_left_alone() -> None:
    old, new = actor_name("j", "0.0", 1), actor_name("j", "0.0", 2)  # two incarnations
    outside = actor_name("j", "1.1", 2)  # not in the recorded generation
    ended = actor_name("done", "0.1", 1)  # an ended job's
    orphan = actor_name("gone", "1.0", 1)  # a job the store does not know
    rows = {
        "j": row("j", JobState.RUNNING, ("0.0",)),
        "done": row("done", JobState.FINISHED, ("0.1",)),
        "w": row("w", JobState.SUBMITTED),
    }
    live = [old, new, outside, ended, orphan]
    plan = plan_recovery(rows, live, {n: report(3) for n in live})
    assert set(plan.kill) == {old, outside, ended, orphan}
    assert plan.jobs == (JobPlan("j", Outcome.FORMED, {"0.0": new}), JobPlan("w", Outcome.WAITING))


def test_a_gpu_two_rows_claim_goes_to_the_first() -> None:
    a, b = actor_name("a", "0.0", 1), actor_name("b", "0.0", 1)
    rows = {"a": row("a", JobState.RUNNING, ("0.0",)), "b": row("b", JobState.RUNNING, ("0.0",))}
    plan = plan_recovery(rows, [a, b], {a: report(3), b: report(3)})
    assert [j.outcome for j in plan.jobs] == [Outcome.FORMED, Outcome.REQUEUE]
    assert plan.kill == (b,) and plan.claimed == {"0.0"}


def gpu_row(gpu: str, state: str, service: str = "", replica: str = "") -> GpuRow:
    node, index = (int(x) for x in gpu.split("."))
    return GpuRow(gpu, node, index, "inference", state, "", service, replica, 0, None)


@pytest.mark.parametrize(
    ("stored_state", "service", "gpu", "claimed", "kept"),
    [
        ("sleep", "s", "2.0", (), True),
        ("protect", "s", "2.0", (), True),
        ("running", "s", "2.0", (), True),
        ("free", "s", "2.0", (), False),  # its GPU's row does not hold a replica
        ("sleep", "gone", "2.0", (), False),  # its service is not registered any more
        ("sleep", "s", "9.0", (), False),  # not a GPU of this cluster
        ("sleep", "s", "2.0", ("2.0",), False),  # a kept worker holds the GPU
    ],
)
def test_a_replica_is_kept_only_where_its_gpus_row_names_it(
    stored_state: str, service: str, gpu: str, claimed: tuple[str, ...], kept: bool
) -> None:
    name = replica_name(service, gpu, 1)
    stored = [gpu_row(gpu, stored_state, service, name)]
    keep, kill = plan_replicas(stored, [name], {"s"}, {"2.0", "2.1"}, claimed)
    assert (keep, kill) == (((name, stored[0]),), ()) if kept else ((), (name,))


def test_a_replica_its_gpus_row_does_not_name_is_killed() -> None:
    mine, other = replica_name("s", "2.0", 2), replica_name("s", "2.0", 1)
    stored = [gpu_row("2.0", "sleep", "s", mine)]
    keep, kill = plan_replicas(stored, [other, mine], {"s"}, {"2.0"}, ())
    assert [n for n, _ in keep] == [mine] and kill == (other,)


def test_a_promoted_standby_is_kept_by_the_name_its_row_records() -> None:
    # A standby's name names its node, not its GPU: the row that names it keeps it;
    # one no row names (never promoted, or promoted before a crash could flush its
    # row) is killed.
    promoted, idle = standby_name(2, 1), standby_name(2, 2)
    stored = [gpu_row("2.1", "running", "s", promoted)]
    keep, kill = plan_replicas(stored, [promoted, idle], {"s"}, {"2.0", "2.1"}, ())
    assert keep == ((promoted, stored[0]),) and kill == (idle,)
