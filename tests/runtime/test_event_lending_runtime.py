"""Event-time lending in the runtime's controller, in process (fake actors, a real
SQLite store): the same driver and control loop as the simulator's
(``tests/sim/test_event_lending_sim.py``), so a job starts at its submission and a
finished job's GPUs go to the next one at once, not at the next tick."""

from __future__ import annotations

from pathlib import Path

from deepboot.core.cluster import ClusterSpec
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.controller.controller_settings import ControllerSettings
from deepboot.runtime.controller.wiring import Controller
from deepboot.runtime.store.jobstore import JobState, LogKind
from deepboot.runtime.store.statedir import StateDir
from deepboot.world.settings import SharedCluster
from tests.runtime.fake_actors import FakeActors
from tests.runtime.test_controller_inprocess import Clock, events, settle


def controller(tmp_path: Path, event_lending: bool) -> tuple[Controller, FakeActors]:
    fake = FakeActors()
    shared = SharedCluster(afe=True, event_lending=event_lending)
    settings = ControllerSettings(policy="deepboot", shared=shared)
    state = StateDir.at(tmp_path / "state").ensure()
    return Controller(state, settings, ClusterSpec.parse("1x4"), fake, clock=Clock()), fake


def submit(ctl: Controller, name: str, **spec: int) -> None:
    ctl.store.submit(JobSpec(name, "m:f", **spec))
    ctl.intake.iteration()
    ctl.driver.run_due()


def test_a_submitted_job_starts_at_once_with_event_lending(tmp_path: Path) -> None:
    ctl, fake = controller(tmp_path, event_lending=True)
    submit(ctl, "a", max_workers=2)
    # No tick has run: the top-up at the submission started it on free GPUs.
    assert ctl.driver.rounds == 0
    held = ctl.board.held("a")
    assert len(held) == 2
    settle(ctl)
    assert ctl.jobs["a"].row.state is JobState.RUNNING
    assert len(events(ctl, LogKind.STARTED)) == 1
    assert {g for _, g, _ in fake.created} == {"0.0", "0.1"}
    # A second job takes the two GPUs left, at its own submission.
    submit(ctl, "b", max_workers=2)
    assert len(ctl.board.held("b")) == 2 and ctl.driver.rounds == 0


def test_without_it_a_submitted_job_waits_for_the_tick(tmp_path: Path) -> None:
    ctl, _ = controller(tmp_path, event_lending=False)
    submit(ctl, "a", max_workers=2)
    assert not ctl.board.held("a")
