"""Command jobs on a real local cluster: an unmodified torchrun script
(examples/runtime/ddp_train.py) grows onto lent inference GPUs, is shrunk by a
reclaim, and finishes, resuming from its own checkpoints at every restart; a script
that fails every time ends FAILED with its stderr; one that ignores SIGTERM is killed
after its grace when its GPU is reclaimed. The GPUs come back FREE."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from tests.runtime.cluster_helpers import REPO, cli, events, job, local_cluster, status, wait_for
from tests.runtime.serving_helpers import post, service_file

pytestmark = pytest.mark.runtime

EXAMPLE = REPO / "examples" / "runtime" / "ddp_train.py"
FLAGS = ("--training-nodes", "1", "--inference-nodes", "2", "--gpus-per-node", "1")
"""A 1-GPU training pool and two inference GPUs to lend."""
CHECKPOINT_EVERY = 20
TARGET = 40_000
GRACE_S = 3.0
RECLAIM_MARGIN_S = 20.0
"""What a reclaim of a command job's GPU may take beyond the job's ``stop_grace_s``:
the controller's poll (0.3 s here), Ray killing the departed actor and starting the
replica's (its cold start: ~1.5 s on 2 idle cores, several under a loaded CI)."""


def _command_job(directory: Path, name: str, command: list[str], **keys: object) -> Path:
    lines = [f'name = "{name}"', "command = [" + ", ".join(f'"{w}"' for w in command) + "]"]
    lines += [f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in keys.items()]
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines).replace("'", '"') + "\n")
    return path


def _log(state: Path, name: str) -> str:
    path = state / "logs" / f"{name}.log"
    return path.read_text() if path.exists() else ""


def _gpus_free(state: Path) -> bool:
    return all(g["state"] == "free" for g in status(state)["gpus"])


def _rank0_steps(log: str, name: str) -> list[int]:
    """Rank 0's step after each progress line and each resume, in order."""
    steps = []
    pat = re.compile(
        rf"\[{re.escape(name)} \S+ rank 0\] (?:step (\d+) samples|resumed at step (\d+))"
    )
    for m in pat.finditer(log):
        steps.append(int(m.group(1) or m.group(2)))
    return steps


def test_torchrun_script_grows_is_reclaimed_and_finishes(tmp_path: Path) -> None:
    with local_cluster(tmp_path / "state", *FLAGS, "--protect-factor", "0.05") as state:
        cli(state, "serve", str(service_file(tmp_path, "echo", delay=0.05, max_replicas=1)))
        path = _command_job(
            tmp_path,
            "ddp",
            ["python", str(EXAMPLE), "--checkpoint-dir", "{checkpoint_dir}",
             "--target-samples", str(TARGET), "--sample-time", "0.004",
             "--checkpoint-every", str(CHECKPOINT_EVERY)],
            min_workers=1,
            max_workers=3,
            batch_size=24,
            stop_grace_s=GRACE_S,
        )  # fmt: skip
        cli(state, "submit", str(path))
        # Grown onto both lent GPUs: its rank 0 resumed on 3 ranks.
        wait_for("ddp on 3 GPUs", lambda: "on 3 ranks" in _log(state, "ddp"), 300)
        assert len(job(state, "ddp")["lent_gpus"]) == 2, job(state, "ddp")
        asked = time.time()
        # A request with no replica and no FREE GPU: a lent GPU is reclaimed.
        code, _ = post(state, "echo", "r1", {"x": [1.0]})
        assert code == 200
        reclaims = [
            e
            for e in events(state, "ddp")
            if e.kind.value == "gpu" and e.detail["op"] == "reclaim" and e.time >= asked
        ]
        assert reclaims, "the request reclaimed no GPU of the job"
        wait_for("ddp to finish", lambda: job(state, "ddp")["state"] == "finished", 600)

        log = (state / "logs" / "ddp.log").read_text()
        done = re.search(r"rank 0\] done at step (\d+) \((\d+) samples\)", log)
        assert done and int(done.group(2)) >= TARGET, log[-3000:]
        steps = _rank0_steps(log, "ddp")
        back = [a - b for a, b in zip(steps, steps[1:], strict=False) if b < a]
        assert all(d <= CHECKPOINT_EVERY for d in back), (back, steps)
        log_events = events(state, "ddp")
        resized = [e.detail for e in log_events if e.kind.value == "resized"]
        assert resized and all(d["how"] == "restart" for d in resized), resized
        # Grew to 3, then shrank (the reclaim): the event log says so even when the
        # smaller group was grown again before its rank 0 printed a line.
        assert any(len(d["from"]) == 3 and len(d["to"]) < 3 for d in resized), resized
        costs = [e.detail["seconds"] for e in log_events if e.kind.value == "progressed"]
        assert costs and all(c > 0 for c in costs), costs
        # The run replays: the recorded snapshots carry the job's restart cost.
        assert "no divergence" in cli(state, "replay").stdout
        wait_for("the GPUs to come back", lambda: _gpus_free_but_replica(state), 60)


def _gpus_free_but_replica(state: Path) -> bool:
    """No GPU held by a job (the service's replica may keep its own)."""
    return all(g["state"] not in ("training", "lent") for g in status(state)["gpus"])


FAILS = """
import sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
for step in range(10):
    print(f"step {step}", flush=True)
    if step == 5:
        print("about to fail", file=sys.stderr, flush=True)
        raise RuntimeError("boom at step 5")
    time.sleep(0.05)
"""

STUBBORN = """
import signal, time
import torch.distributed as dist
signal.signal(signal.SIGTERM, signal.SIG_IGN)
dist.init_process_group("gloo")
print(f"up on {dist.get_world_size()}", flush=True)
while True:
    time.sleep(0.1)
"""


def test_failing_and_stubborn_scripts(tmp_path: Path) -> None:
    (tmp_path / "fails.py").write_text(FAILS)
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    with local_cluster(tmp_path / "state", *FLAGS, "--protect-factor", "0.05") as state:
        # Fails at step 5 every time: restarted twice, with back-off, then FAILED.
        cli(state, "submit", str(_command_job(
            tmp_path, "fails", ["python", "fails.py"], max_workers=1, max_restarts=2,
        )))  # fmt: skip
        wait_for("fails to fail", lambda: job(state, "fails")["state"] == "failed", 300)
        failed = job(state, "fails")
        assert "failed 3 times (max_restarts = 2)" in failed["message"]
        assert "RuntimeError: boom at step 5" in failed["message"]
        assert "about to fail" in failed["message"]
        shown = cli(state, "status").stdout
        assert "boom at step 5" in shown
        retrying = [e.detail for e in events(state, "fails") if e.kind.value == "retrying"]
        assert [d["failures"] for d in retrying] == [1, 2], retrying
        assert [d["backoff_s"] for d in retrying] == [1.0, 2.0]
        logs = cli(state, "logs", "fails").stdout
        assert any(
            line.startswith("[fails 0.0 rank 0] ") and "RuntimeError: boom at step 5" in line
            for line in logs.splitlines()
        ), logs[-2000:]
        wait_for("its GPU to come back", lambda: _gpus_free(state), 60)

        # Ignores SIGTERM: grows onto the lent GPUs; a request reclaims one; the group
        # is killed after the grace and the replica takes the GPU.
        cli(state, "serve", str(service_file(tmp_path, "echo", delay=0.05, max_replicas=1)))
        cli(state, "submit", str(_command_job(
            tmp_path, "stubborn", ["python", "stubborn.py"],
            min_workers=1, max_workers=3, stop_grace_s=GRACE_S,
        )))  # fmt: skip
        # On every GPU (both inference GPUs lent): the request must reclaim one.
        wait_for("stubborn on 3 GPUs", lambda: _formed_on(state, "stubborn", 3), 300)
        answer: dict[str, object] = {}
        started = time.monotonic()
        t = threading.Thread(target=lambda: answer.update(r=post(state, "echo", "r", {"x": [1]})))
        t.start()
        t.join(GRACE_S + RECLAIM_MARGIN_S + 30)
        took = time.monotonic() - started
        assert answer.get("r", (0,))[0] == 200, answer  # type: ignore[index]
        assert GRACE_S <= took <= GRACE_S + RECLAIM_MARGIN_S, took
        log = (state / "logs" / "stubborn.log").read_text()
        assert "still running 3 s after SIGTERM: SIGKILL" in log
        cli(state, "cancel", "stubborn")
        wait_for("stubborn cancelled", lambda: job(state, "stubborn")["state"] == "cancelled", 60)
        wait_for("no job holds a GPU", lambda: _gpus_free_but_replica(state), 60)


def _formed_on(state: Path, name: str, size: int) -> bool:
    """The job runs on ``size`` GPUs and its rank 0 said so."""
    if job(state, name)["num_workers"] != size:
        return False
    return f"up on {size}" in _log(state, name)
