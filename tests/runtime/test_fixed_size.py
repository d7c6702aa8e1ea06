"""A fixed-size policy on the runtime sizes jobs as in the simulator: ``fifo`` runs a
job on the GPUs it asks for (``workers``), with the user's batch split over them, and
never resizes it; a job it can never run is refused at once, with the reason."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.core.params import BatchLimits  # noqa: E402
from deepboot.perf.goodput import select_batch  # noqa: E402
from deepboot.runtime.store.jobstore import LogKind  # noqa: E402
from tests.runtime.cluster_helpers import (  # noqa: E402
    cancel_leftover_jobs,
    cli,
    events,
    job,
    local_cluster,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.runtime


def test_fifo_runs_a_job_on_the_gpus_it_asks_for_and_refuses_one_it_never_could(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    flags = ["--policy", "fifo", "--training-nodes", "1", "--inference-nodes", "1"]
    with local_cluster(state, *flags, "--gpus-per-node", "2", "--no-lending", params=()):
        never = write_job(tmp_path, "too-big", 0.001, 0.05, min_workers=3, max_workers=4)
        cli(state, "submit", str(never))
        wait_for("too-big refused", lambda: job(state, "too-big")["state"] == "failed", 120)
        [failed] = [e for e in events(state, "too-big") if e.kind is LogKind.FAILED]
        assert "at most 2" in failed.detail["error"], failed.detail
        assert "lending is off" in failed.detail["error"], failed.detail

        asked = write_job(tmp_path, "fixed-a", 0.0001, 0.05, max_workers=4, workers=2)
        cli(state, "submit", str(asked))
        [started] = wait_for(
            "fixed-a started",
            lambda: [e for e in events(state, "fixed-a") if e.kind is LogKind.STARTED],
            300,
        )
        assert len(started.detail["workers"]) == 2
        # The user's batch (32), split over the two workers: not the goodput model's.
        limits = BatchLimits(32, 256, 1, 64)
        local, extra = select_batch(None, limits, 1, 2, 32)
        assert (started.detail["local_bsz"], started.detail["accum"]) == (local, extra + 1)
        time.sleep(8.0)  # four rounds: FIFO never resizes a running job
        kinds = {e.kind for e in events(state, "fixed-a")}
        assert LogKind.RESIZED not in kinds and job(state, "fixed-a")["num_workers"] == 2
        cancel_leftover_jobs(state)
