"""A control loop's recording, and its replay: the codec round-trips every value a
step reads or returns; a simulated run (DeepBoot on the demo's jobs and inference
tasks) recorded step by step replays with no divergence on a loop built alike, and a
loop built with another policy parameter diverges at a step the replay names; the
recording keeps within its size bound and still replays from its oldest chunk."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from deepboot.core import ClusterSpec
from deepboot.core.gpu import GpuState
from deepboot.matrix import parse_run, sim_config
from deepboot.perf.catalog import load_catalog
from deepboot.policies import registry
from deepboot.scheduler import Scheduler
from deepboot.scheduler.control import ControlLoop
from deepboot.scheduler.events import EventKind
from deepboot.sim.engine import Simulation
from deepboot.sim.workload import load_workload
from deepboot.world.recording import (
    Recorder,
    StartRecord,
    StepRecord,
    decode,
    encode,
    read_recording,
    replay,
)

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo-deepboot.csv"
CLUSTER = ClusterSpec.parse("4x4", 2)


def simulation(params: Mapping[str, str]) -> Simulation:
    apps = load_catalog()
    workload = load_workload(DEMO, apps.keys())
    config = sim_config(parse_run("deepboot"), 60.0, 0, 2)
    config = dataclasses.replace(config, max_time=2 * 3600.0)
    policy = registry.create("deepboot", **params)
    return Simulation(workload, CLUSTER, Scheduler(policy), apps, config)


def loop_for(settings: Mapping[str, Any]) -> ControlLoop:
    return simulation(settings["params"]).loop


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("rec")
    rec = Recorder(where)
    sim = simulation({})
    rec.start({"params": {}}, CLUSTER)
    sim.driver.observe = rec.observe
    sim.run()
    rec.close()
    return where


def test_every_recorded_value_decodes_equal(recorded: Path) -> None:
    records = list(read_recording(recorded))
    assert isinstance(records[0], StartRecord) and records[0].cluster == CLUSTER
    steps = [r for r in records if isinstance(r, StepRecord)]
    kinds = {r.event.kind for r in steps}
    assert {EventKind.TICK, EventKind.INFERENCE_ARRIVAL, EventKind.RETRY} <= kinds
    assert any(r.step.ops for r in steps) and any(r.cursor is not None for r in steps)
    for r in steps[:200]:
        for value in (r.event, r.cursor, r.snapshot, r.step):
            assert decode(encode(value)) == value
    states = {g.state for r in steps for g in r.snapshot.gpus}
    assert {GpuState.LENT, GpuState.RUNNING, GpuState.PROTECT} <= states


def test_a_recorded_run_replays_with_no_divergence(recorded: Path) -> None:
    result = replay(read_recording(recorded), loop_for)
    assert result.divergence is None and result.starts == 1
    assert result.steps == sum(1 for r in read_recording(recorded) if isinstance(r, StepRecord))


def test_another_policy_parameter_diverges_and_the_replay_names_the_step(recorded: Path) -> None:
    def other(settings: Mapping[str, Any]) -> ControlLoop:
        return loop_for({"params": {"restart_delay": "120"}})

    result = replay(read_recording(recorded), other)
    d = result.divergence
    assert d is not None and d.recorded != d.replayed
    assert d.event.kind in (EventKind.TICK, EventKind.RETRY)
    # It goes on past the divergence to the end, and says what differed after it.
    assert result.steps == sum(1 for r in read_recording(recorded) if isinstance(r, StepRecord))
    after = result.after
    assert after is not None and after.stopped is None
    assert 1 <= after.differing <= after.steps == result.steps - d.index
    assert after.recorded != after.replayed or after.by_job
    assert result.first_now is not None and result.first_now <= d.now


def test_the_recording_keeps_its_bound_and_replays_from_its_oldest_chunk(
    recorded: Path, tmp_path: Path
) -> None:
    rec = Recorder(tmp_path, keep_bytes=600_000, chunk_bytes=100_000)
    rec.start({"params": {}}, CLUSTER)
    for r in read_recording(recorded):
        if isinstance(r, StepRecord):
            rec.observe(r.event, r.cursor, r.snapshot, r.rng_state, r.step)
    rec.close()
    chunks = sorted(tmp_path.glob("loop-*.jsonl"))
    assert len(chunks) >= 3 and sum(c.stat().st_size for c in chunks) <= 700_000
    assert not (tmp_path / "loop-000001.jsonl").exists()  # the oldest went first
    # The kept chunks start mid-run, but each repeats the run's start: it replays.
    result = replay(read_recording(tmp_path), loop_for)
    assert result.steps > 0 and result.starts == 0
