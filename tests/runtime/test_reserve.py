"""The lending reserve on the runtime (``deepboot up --reserve``), end to end: a real
local Ray cluster (1 training and 1 inference node x 2 logical GPUs), a real gated
torch job that borrows the inference GPUs, a service capped at one replica, and five
lull/spike cycles of requests from ``deepboot load``.

Without the reserve, DeepBoot lends the idle replica's GPU in every lull and takes it
back (a reclaim, the job shrinking) in the next spike. With it, the requests of the
last 20 s say the next ones will come before the next tick, so the replica is held
warm through the lulls: the whole run reclaims fewer GPUs. Counts are compared over
all five cycles, never a single spike.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.runtime.store.jobstore import LogKind  # noqa: E402
from tests.runtime.cluster_helpers import (  # noqa: E402
    cancel_leftover_jobs,
    cli,
    events,
    job,
    local_cluster,
    status,
    wait_for,
)
from tests.runtime.serving_helpers import (  # noqa: E402
    Load,
    gated_job,
    post,
    rate_profile,
    service_file,
)

pytestmark = pytest.mark.runtime

CYCLES = 5
SPIKE = [(0, 3), (4, 0)]  # 3 requests a second for 4 s (about 12)
LULL_S = 10.0  # long enough for the replica to sleep and the job to borrow its GPU


def _cycles(state: Path, tmp_path: Path, reserve: bool) -> tuple[int, int]:
    """(reclaims, requests) of five lull/spike cycles on a fresh cluster."""
    flags = ["--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "2"]
    flags += ["--protect-factor", "0.02"]  # protect times of 0.6-2.4 s
    if reserve:
        flags += ["--reserve", "--reserve-window", "20"]
    with local_cluster(state, *flags):
        cli(state, "serve", str(service_file(tmp_path, "echo", delay=0.1, max_replicas=1)))
        assert post(state, "echo", "warm-up", {"x": [0.0]})[0] == 200
        cli(state, "submit", str(gated_job(tmp_path, "trainer", tmp_path / "gate", 4)))
        # Both runs start alike: the job has borrowed the inference GPUs (the one
        # warm-up request is no load the reserve would hold a replica for).
        wait_for(
            "the job to borrow both inference GPUs",
            lambda: len(job(state, "trainer")["lent_gpus"]) == 2,
            300,
        )
        began = time.time()
        requests = 0
        for n in range(CYCLES):
            load = Load(state, "echo", rate_profile(tmp_path, f"spike{n}", SPIKE),
                        tmp_path / f"spike-{reserve}-{n}.csv")  # fmt: skip
            rows = load.rows()
            assert rows and all(r["status"] == "200" for r in rows), rows[:3]
            requests += len(rows)
            time.sleep(LULL_S)
        log = events(state)
        reclaims = sum(
            1
            for e in log
            if e.kind is LogKind.GPU and e.detail["op"] == "reclaim" and e.time >= began
        )
        assert job(state, "trainer")["state"] == "running", status(state)
        cancel_leftover_jobs(state)
    return reclaims, requests


def test_the_reserve_reclaims_fewer_gpus_over_five_lull_spike_cycles(tmp_path: Path) -> None:
    without, n_without = _cycles(tmp_path / "plain", tmp_path, reserve=False)
    with_reserve, n_with = _cycles(tmp_path / "reserve", tmp_path, reserve=True)
    print(f"reclaims over {CYCLES} cycles: {without} without --reserve ({n_without} "
          f"requests), {with_reserve} with it ({n_with} requests)")  # fmt: skip
    assert without >= CYCLES - 2, "DeepBoot alone should reclaim in most spikes"
    assert with_reserve < without
    # The controllers recorded every step of their loops: each run replays exactly, and
    # FIFO (the job at its min_workers, no borrowing) would have decided otherwise. (Any
    # elastic policy gives this one job every GPU it may hold, whatever its parameters:
    # tests/world/test_recording.py shows a parameter's divergence on a richer run.)
    for run in ("plain", "reserve"):
        same = cli(tmp_path / run, "replay", check=False)
        assert same.returncode == 0 and "no divergence" in same.stdout, same.stdout
    other = cli(tmp_path / "reserve", "replay", "--policy", "fifo", check=False)
    assert other.returncode == 1 and "first divergence at step" in other.stdout, other.stdout
