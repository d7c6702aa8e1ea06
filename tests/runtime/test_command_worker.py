"""A command job's worker (deepboot.elastic.command) with real processes, no Ray: the
environment it gives a script against a real torchrun's, a two-rank DDP run of the
example script, a stop that must end in SIGKILL, and a failure's message."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deepboot.elastic.command import CommandWorker
from deepboot.elastic.protocol import Generation, WorkerConfig, WorkerStatus

pytestmark = pytest.mark.runtime  # torch and torchrun: the runtime extra

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "runtime" / "ddp_train.py"

DUMP_ENV = """
import json, os, sys
keep = set(json.loads(os.environ["BASE_KEYS"]))
out = {k: v for k, v in os.environ.items() if k not in keep}
with open(os.path.join(sys.argv[1], f"env-{os.environ['RANK']}.json"), "w") as f:
    json.dump(out, f)
"""

DIFFERENT = {
    # Where our value differs from torchrun's, and why.
    "MASTER_ADDR": "the store's host: rank 0's node (127.0.0.1 on a loopback cluster), "
    "where torchrun says localhost",
    "MASTER_PORT": "a free port rank 0's worker picks per generation",
    "TORCHELASTIC_RUN_ID": "the job's name, where torchrun makes a uuid",
    "TORCHELASTIC_ERROR_FILE": "a file per rank in the job's log directory",
    "TORCHELASTIC_USE_AGENT_STORE": "False: no agent, rank 0's init_process_group hosts the store",
}
OURS_ONLY = {
    "CUDA_VISIBLE_DEVICES": "the GPUs the scheduler gave this node's ranks",
    "DEEPBOOT_REPORT_FILE": "where deepboot.elastic.report() writes (a no-op without it)",
    "PYTHONUNBUFFERED": "lines reach the job's log as they are printed",
}


def _gen(tmp: Path, members: tuple[str, ...], number: int = 1, stop: bool = False) -> Generation:
    (tmp / "rdzv").mkdir(exist_ok=True)
    return Generation(number, members, str(tmp / "rdzv" / f"gen-{number}"), 1, 1, 1, stop=stop)


def _config(tmp: Path, command: list[str], **extra: object) -> WorkerConfig:
    return WorkerConfig(
        "job",
        "",
        {},
        str(tmp / "job.log"),
        collective_timeout=30.0,
        command=tuple(command),
        workdir=str(tmp),
        **extra,  # type: ignore[arg-type]
    )


def _wait(workers: list[CommandWorker], statuses: set[WorkerStatus], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(w.report().status in statuses for w in workers):
            return
        time.sleep(0.1)
    raise AssertionError([w.report() for w in workers])


def test_example_imports_nothing_from_deepboot() -> None:
    tree = ast.parse(EXAMPLE.read_text())
    modules = {
        (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in (n.names if isinstance(n, ast.Import) else [n])  # type: ignore[attr-defined]
    }
    assert modules and not any(m.split(".")[0] == "deepboot" for m in modules), modules


def test_example_runs_under_torchrun_to_its_end(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run(
        [str(torchrun), "--nproc-per-node", "2", str(EXAMPLE),
         "--checkpoint-dir", str(tmp_path), "--target-samples", "960"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done at step 40 (960 samples)" in proc.stdout
    assert (tmp_path / "ddp_train.pt").exists()


def test_environment_against_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables a command's process gets are torchrun 2.13's: every one of a
    real torchrun's (2 processes) is there with the same value, or named in
    DIFFERENT with why; ours beyond it are named in OURS_ONLY."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # as a local cluster's raylets have it
    script = tmp_path / "dump.py"
    script.write_text(DUMP_ENV)
    real, mine = tmp_path / "real", tmp_path / "mine"
    real.mkdir()
    mine.mkdir()
    torchrun = Path(sys.executable).parent / "torchrun"
    base = json.dumps([*os.environ, "BASE_KEYS"])
    env = {**os.environ, "BASE_KEYS": base}
    subprocess.run(
        [str(torchrun), "--nproc-per-node", "2", str(script), str(real)],
        env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    gen = _gen(tmp_path, ("0.0", "0.1"))
    cfg = _config(
        tmp_path,
        ["python", str(script), str(mine)],
        env={"BASE_KEYS": base, "TORCHELASTIC_RUN_ID": "job"},
    )
    workers = [CommandWorker(cfg, g, gen) for g in gen.members]
    _wait(workers, {WorkerStatus.DONE})
    for rank in (0, 1):
        theirs = json.loads((real / f"env-{rank}.json").read_text())
        ours = json.loads((mine / f"env-{rank}.json").read_text())
        theirs.pop("_", None)  # the shell's, not torchrun's
        missing = sorted(set(theirs) - set(ours))
        assert not missing, f"torchrun sets {missing}, deepboot does not"
        changed = sorted(k for k in theirs if theirs[k] != ours[k] and k not in DIFFERENT)
        assert not changed, {k: (theirs[k], ours[k]) for k in changed}
        extra = sorted(set(ours) - set(theirs) - set(OURS_ONLY) - {"BASE_KEYS"})
        assert not extra, f"deepboot sets {extra} beyond torchrun's"
        assert ours["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert ours["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_two_ranks_train_the_example_together(tmp_path: Path) -> None:
    gen = _gen(tmp_path, ("0.0", "1.0"))  # two nodes: LOCAL_RANK 0 on each
    cfg = _config(
        tmp_path,
        [
            "python",
            str(EXAMPLE),
            "--checkpoint-dir",
            str(tmp_path / "ck"),
            "--target-samples",
            "480",
        ],
    )
    workers = [CommandWorker(cfg, g, gen) for g in gen.members]
    _wait(workers, {WorkerStatus.DONE})
    log = (tmp_path / "job.log").read_text()
    assert "[job 0.0 rank 0] done at step 20 (480 samples)" in log
    reports = [w.report() for w in workers]
    assert [r.generation for r in reports] == [1, 1]
    assert reports[0].progress_at > 0  # its first line: the restart's end


def test_stop_kills_a_rank_that_ignores_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\n"
        "while True:\n    time.sleep(0.1)\n"
    )
    gen = _gen(tmp_path, ("0.0",))
    worker = CommandWorker(_config(tmp_path, ["python", str(script)], stop_grace_s=1.0), "0.0", gen)
    _wait([worker], {WorkerStatus.RUNNING})
    deadline = time.monotonic() + 30
    while "up" not in (tmp_path / "job.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    worker.offer(_gen(tmp_path, ("0.0",), number=2, stop=True))
    _wait([worker], {WorkerStatus.DEPARTED}, timeout=30)
    took = time.monotonic() - started
    assert took >= 1.0, took  # the grace was given
    assert "SIGKILL" in (tmp_path / "job.log").read_text()


def test_a_failing_rank_reports_its_stderr_tail(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(
        "import sys\n"
        "for step in range(10):\n"
        "    print(f'step {step}', flush=True)\n"
        "    if step == 5:\n"
        "        raise RuntimeError('boom at step 5')\n"
    )
    gen = _gen(tmp_path, ("0.0",))
    worker = CommandWorker(_config(tmp_path, ["python", str(script)]), "0.0", gen)
    _wait([worker], {WorkerStatus.FAILED})
    error = worker.report().error
    assert "rank 0 (0.0) exited with status 1" in error
    assert "RuntimeError: boom at step 5" in error
    log = (tmp_path / "job.log").read_text()
    assert "[job 0.0 rank 0] RuntimeError: boom at step 5" in log


@pytest.mark.parametrize("bad", [["/no/such/program"]])
def test_a_command_that_cannot_start_fails(tmp_path: Path, bad: list[str]) -> None:
    gen = _gen(tmp_path, ("0.0",))
    worker = CommandWorker(_config(tmp_path, bad), "0.0", gen)
    _wait([worker], {WorkerStatus.FAILED})
    assert "did not start" in worker.report().error


REPORTS = """
import os, time
from deepboot.elastic import report
for step in range(1, 31):
    time.sleep(0.02)
    report(samples=step * 32, batch_size=32, step=step, loss=1.0 / step)
time.sleep(1.0)
"""


def test_reports_give_step_loss_and_throughput(tmp_path: Path) -> None:
    """A script's report() calls reach its worker: step, loss, one measurement per
    report read (rank 0), and the restart's end at the first report."""
    script = tmp_path / "reports.py"
    script.write_text(REPORTS)
    gen = _gen(tmp_path, ("0.0",))
    worker = CommandWorker(_config(tmp_path, ["python", str(script)]), "0.0", gen)
    measurements = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = worker.report()
        measurements.extend(r.measurements)
        if r.status is WorkerStatus.DONE:
            break
        time.sleep(0.1)
    assert r.status is WorkerStatus.DONE and r.step == 30
    assert abs(r.loss - 1 / 30) < 1e-9
    assert r.progress_at > 0
    assert measurements, "no throughput measurement from the reports"
    for m in measurements:
        assert m.num_replicas == 1 and m.local_bsz == 32
        assert 0.015 < m.step_time < 1.0, m  # ~20 ms a step, loosely


def test_report_is_a_no_op_outside_deepboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepboot.elastic.scriptreport import REPORT_ENV, read_progress, report

    monkeypatch.delenv(REPORT_ENV, raising=False)
    report(samples=10, batch_size=2)  # nothing to write to: nothing happens
    assert not list(tmp_path.iterdir())
    path = tmp_path / "p.json"
    monkeypatch.setenv(REPORT_ENV, str(path))
    report(samples=10, batch_size=2, step=5)
    p = read_progress(str(path))
    assert p is not None and (p.samples, p.batch_size, p.step) == (10, 2, 5)
    path.write_text("not json")
    assert read_progress(str(path)) is None
    with pytest.raises(ValueError, match="must be >= 0"):
        report(samples=-1)
