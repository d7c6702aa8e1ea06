"""``deepboot replay`` on a controller's own recording, in-process (fake actors, the
real controller and store): FIFO runs two jobs through a crash and a restart; the
replay of every recorded step agrees, while a replay with another policy names the
first step where it would have decided otherwise (exit status 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepboot.cli.main import main
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.client.replay import replay_state
from deepboot.runtime.store.jobstore import JobStore
from deepboot.runtime.store.statedir import StateDir
from tests.runtime.fake_actors import FakeActors
from tests.runtime.test_controller_inprocess import Clock
from tests.runtime.test_crash_points import WORK, controller, run_to_the_end


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """Two FIFO jobs run to their end; the first controller dies half way."""
    state = tmp_path / "state"
    clock = Clock()
    fake = FakeActors(work={"a": WORK, "b": WORK}, clock=clock)
    first = controller(state, fake, clock)
    first.start()
    first.store.submit(JobSpec("a", "m:f", max_workers=3, workers=2))
    first.store.submit(JobSpec("b", "m:f", max_workers=3, workers=3))
    for _ in range(12):
        clock.t += 0.5
        fake.advance()
        first.turn(polled=True)
    first.store.close()
    first.recorder.close()  # it dies here (nothing else of it runs again)
    second = controller(state, fake, clock)
    second.start()
    run_to_the_end(second, fake, clock, {"a", "b"})
    second.recorder.close()
    store = JobStore(StateDir.at(state).db)
    assert {r.name: r.state.value for r in store.jobs()} == {"a": "finished", "b": "finished"}
    store.close()
    return state


def test_the_recorded_run_replays_with_no_divergence(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = replay_state(StateDir.at(recorded))
    assert result.divergence is None and result.starts == 2 and result.steps > 10
    code, out, _ = _cli(capsys, "replay", str(recorded))
    assert code == 0
    assert f"replayed {result.steps} steps (2 controller starts): no divergence" in out


def test_another_policy_diverges_at_a_step_the_replay_names(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = replay_state(StateDir.at(recorded), policy="deepboot")
    assert result.divergence is not None
    code, out, _ = _cli(capsys, "replay", str(recorded), "--policy", "deepboot")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"first divergence at step {result.divergence.index}, ")
    # Seconds into the recording, not the epoch.
    since = float(lines[0].split(", ")[1].split(" s into")[0])
    assert 0.0 <= since < 3600.0
    assert lines[1].startswith("  recorded: ") and lines[2].startswith("  replayed: ")
    assert result.after is not None
    assert lines[3].startswith(f"after it: {result.after.differing} of {result.after.steps} steps")
    assert "operations, recorded -> replayed: " in out


def test_no_recording_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    StateDir.at(tmp_path / "state").ensure()
    code, _, err = _cli(capsys, "replay", str(tmp_path / "state"))
    assert code == 2 and err.count("\n") == 1 and "no recording" in err
