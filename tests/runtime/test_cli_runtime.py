"""The runtime's commands where no cluster is needed: their errors are one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepboot.cli.main import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("policy", ["optimus", "afs", "lyra"])
def test_up_refuses_oracle_policies_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    state = tmp_path / "state"
    code, _, err = _run(capsys, "up", "--policy", policy, "--state-dir", str(state))
    assert code == 2
    assert err.startswith(f"deepboot: error: policy '{policy}' needs each job's remaining work")
    assert "deepboot" in err and "pollux" in err  # it names the usable ones
    assert not (state / "cluster.json").exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["up", "--policy", "nope"], "nope"),
        (["up", "--param", "restart_delay=x"], "restart_delay"),
        (["up", "--gpus-per-node", "0"], "--gpus-per-node must be a positive integer"),
        (["up", "--interval", "0"], "--interval must be a positive number"),
        (["status"], "no deepboot state"),
        (["down"], "no cluster is up"),
        (["cancel", "x"], "no deepboot state"),
    ],
    ids=["unknown-policy", "bad-param", "zero-gpus", "zero-interval", "status", "down", "cancel"],
)
def test_runtime_command_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    code, _, err = _run(capsys, *argv, "--state-dir", str(tmp_path / "state"))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("deepboot: error:")
    assert words in err


def test_submit_bad_job_file_names_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "a"\nentry = "m:f"\nmin_workers = 3\nmax_workers = 2\n')
    code, _, err = _run(capsys, "submit", str(job), "--state-dir", str(tmp_path / "s"))
    assert code == 2
    assert (
        err == f"deepboot: error: {job}: field 'max_workers': must be >= min_workers (3), got 2\n"
    )


def test_submit_status_cancel_without_a_cluster_use_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store is enough for these: a job waits in it until a controller runs."""
    state = tmp_path / "s"
    state.mkdir()
    job = tmp_path / "job.toml"
    job.write_text('name = "a"\nentry = "m:f"\n')
    from deepboot.runtime.store import JobStore

    JobStore(state / "deepboot.db").close()
    assert _run(capsys, "submit", str(job), "--state-dir", str(state))[0] == 0
    code, out, _ = _run(capsys, "status", "--json", "--state-dir", str(state))
    assert code == 0 and '"state": "submitted"' in out and '"up": false' in out
    code, out, _ = _run(capsys, "cancel", "a", "--state-dir", str(state))
    assert code == 0 and "cancelling a" in out
    code, _, err = _run(capsys, "submit", str(job), "--state-dir", str(state))
    assert code == 2 and "exists already" in err


def test_serve_bad_service_file_names_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    svc = tmp_path / "svc.toml"
    svc.write_text('name = "a"\nmodel = "m"\nhandler = "mod:f"\nconcurrency = 0\n')
    code, _, err = _run(capsys, "serve", str(svc), "--state-dir", str(tmp_path / "s"))
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith(f"deepboot: error: {svc}: field 'concurrency': ")


def test_serve_registers_a_service_in_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deepboot.runtime.statedir import StateDir
    from deepboot.runtime.store import JobStore

    example = Path(__file__).resolve().parents[2] / "examples" / "runtime" / "echo.toml"
    state = StateDir.at(tmp_path / "s").ensure()
    JobStore(state.db).close()
    code, out, _ = _run(capsys, "serve", str(example), "--state-dir", str(state.root))
    assert code == 0 and "registered service echo" in out
    code, out, _ = _run(capsys, "serve", str(example), "--state-dir", str(state.root))
    assert code == 0 and "already registered" in out
    store = JobStore(state.db)
    [row] = store.services()
    assert row.spec.name == "echo" and row.spec.max_replicas == 4
    assert [e.detail["service"] for e in store.events()] == ["echo"]
    store.close()
