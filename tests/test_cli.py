"""The ``deepboot`` command: help, exit codes, one-line errors, workload and policy tools."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_cli

from deepboot.sim.workload import load_workload

APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
POLLUX_HEADER = "name,time,application,num_replicas,batch_size"
PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"


def make_csv(tmp_path: Path, *lines: str, name: str = "w.csv") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def make_philly(tmp_path: Path, jobs: int = 40) -> Path:
    """A small Philly trace: ``jobs`` arrivals between 03:00 and 04:00, mixed sizes."""
    rows = [
        f"2017-10-0{1 + i % 9} 03:{i % 60:02d}:{(7 * i) % 60:02d},{600 + i},"
        f"{1 + i % 4},{(0.3 + i % 5 * 20) * 3600:.1f},c{i % 3}"
        for i in range(jobs)
    ]
    return make_csv(tmp_path, PHILLY_HEADER, *rows, name="philly.csv")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--help"], ["examples:", "simulate", "workload", "catalog", "policies"]),
        (["simulate", "--help"], ["--workload", "--summary-json", "--param", "examples:"]),
        (["workload", "from-philly", "--help"], ["--philly", "--hours", "GPU"]),
        (["catalog", "fit", "--help"], ["--profiles", "--out"]),
    ],
    ids=["top", "simulate", "from-philly", "catalog-fit"],
)
def test_help_teaches(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]
) -> None:
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    for word in words:
        assert word in out


@pytest.mark.parametrize(
    "argv",
    [[], ["simulate", "--policy", "pollux"], ["simulate", "--workload", "w.csv"], ["frobnicate"]],
    ids=["no-command", "no-workload", "no-policy", "unknown-command"],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert "usage: deepboot" in err
    assert "Traceback" not in err


# (case id, lines of the workload file, "line:field" expected in the message)
WORKLOAD_ERRORS = [
    ("malformed-row", [POLLUX_HEADER, "a,1,ncf,1"], ":2: field 'batch_size'"),
    ("unknown-model", [POLLUX_HEADER, "a,1,gpt5,1,32"], ":2: field 'application'"),
    ("negative-time", [POLLUX_HEADER, "a,1,ncf,1,32768", "b,-1,ncf,1,32768"], ":3: field 'time'"),
    ("non-numeric-time", [POLLUX_HEADER, "a,noon,ncf,1,32768"], ":2: field 'time'"),
    ("empty-file", [], ":1: field 'header'"),
    ("header-only", [POLLUX_HEADER], ":1: field 'header'"),
]


@pytest.mark.parametrize(
    ("lines", "where"),
    [case[1:] for case in WORKLOAD_ERRORS],
    ids=[case[0] for case in WORKLOAD_ERRORS],
)
def test_bad_workload_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, lines: list[str], where: str
) -> None:
    path = make_csv(tmp_path, *lines)
    code, _, err = run_cli(
        capsys, "simulate", "--workload", str(path), "--policy", "pollux", "--cluster", "2x4"
    )
    assert code == 2
    assert_one_line_error(err, f"{path}{where}")


def test_unknown_model_error_lists_known_models(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = make_csv(tmp_path, POLLUX_HEADER, "a,1,gpt5,1,32")
    code, _, err = run_cli(capsys, "simulate", "--workload", str(path), "--policy", "pollux")
    assert code == 2
    assert_one_line_error(err, "'gpt5'", "known models:", "cifar10", "ncf")


def test_missing_workload_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "absent.csv"
    code, _, err = run_cli(capsys, "simulate", "--workload", str(path), "--policy", "pollux")
    assert code == 2
    assert_one_line_error(err, f"{path}: file not found")


def test_missing_profile_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    workload = make_csv(tmp_path, POLLUX_HEADER, "a,1,ncf,1,32768")
    missing = tmp_path / "no-profiles"
    code, _, err = run_cli(
        capsys,
        "simulate",
        "--workload",
        str(workload),
        "--policy",
        "pollux",
        "--profiles",
        str(missing),
    )
    assert code == 2
    assert_one_line_error(err, str(missing))


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--cluster", "16by4"], ["16by4", "NODESxGPUS"]),
        (["--cluster", "4x4", "--inference-nodes", "4"], ["--inference-nodes"]),
        (["--interval", "0"], ["--interval"]),
        (["--param", "novalue"], ["novalue", "key=value"]),
        (["--param", "no_such_knob=1"], ["no_such_knob"]),
    ],
    ids=["bad-cluster", "all-inference", "zero-interval", "param-without-equals", "unknown-param"],
)
def test_bad_settings_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], words: list[str]
) -> None:
    workload = make_csv(tmp_path, POLLUX_HEADER, "a,1,ncf,1,32768")
    code, _, err = run_cli(
        capsys, "simulate", "--workload", str(workload), "--policy", "pollux", *extra
    )
    assert code == 2
    assert_one_line_error(err, *words)


def test_unknown_policy_lists_known(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from deepboot.policies import registry

    workload = make_csv(tmp_path, POLLUX_HEADER, "a,1,ncf,1,32768")
    code, _, err = run_cli(capsys, "simulate", "--workload", str(workload), "--policy", "nope")
    assert code == 2
    assert_one_line_error(err, "'nope'", *registry.names())


def test_policies_lists_every_registered_policy(capsys: pytest.CaptureFixture[str]) -> None:
    from deepboot.policies import registry

    code, out, _ = run_cli(capsys, "policies")
    assert code == 0
    for name in registry.names():
        assert name in out


def test_from_philly_writes_a_deterministic_workload(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    philly = make_philly(tmp_path)
    outs = [tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"]
    for out_path, seed in zip(outs, ["5", "5", "6"], strict=True):
        code, out, _ = run_cli(
            capsys, "workload", "from-philly", "--philly", str(philly), "--jobs", "12",
            "--hours", "1", "--seed", seed, "--out", str(out_path),
        )  # fmt: skip
        assert code == 0
        assert f"12 jobs written to {out_path}" in out
    assert outs[0].read_bytes() == outs[1].read_bytes()
    assert outs[0].read_bytes() != outs[2].read_bytes()
    jobs = load_workload(outs[0], APPS).training
    assert len(jobs) == 12
    assert all(0 <= j.submit_time < 3600 for j in jobs)


def test_from_philly_bad_row_and_too_many_jobs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    philly = make_csv(
        tmp_path, PHILLY_HEADER, "2017-10-09 03:00:00,600,1,600,c", "2017-10-09 03:01:00,x,1,1,c",
        name="philly.csv",
    )  # fmt: skip
    out = tmp_path / "w.csv"
    argv = ["workload", "from-philly", "--philly", str(philly), "--out", str(out)]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert_one_line_error(err, f"{philly}:3: field 'duration'")
    code, _, err = run_cli(capsys, *argv[:3], str(make_philly(tmp_path, 5)), *argv[4:])
    assert code == 2
    assert_one_line_error(err, "only 5 Philly jobs")
    assert not out.exists()


def test_catalog_fit_missing_profiles(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    code, _, err = run_cli(
        capsys, "catalog", "fit", "--profiles", str(missing), "--out", str(tmp_path / "c.json")
    )
    assert code == 2
    assert_one_line_error(err, str(missing))


def test_installed_console_script_exit_code_and_no_traceback(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "deepboot"
    if not script.exists():
        pytest.skip("the deepboot console script is not installed next to this Python")
    missing = tmp_path / "absent.csv"
    proc = subprocess.run(
        [str(script), "simulate", "--workload", str(missing), "--policy", "pollux"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == f"deepboot: error: {missing}: file not found\n"


def test_console_entry_runs_exit_handlers_flushes_and_keeps_the_code(tmp_path: Path) -> None:
    """The console script skips the interpreter's teardown (see ``entry``): the exit
    handlers still run, piped output is complete, and the exit code is main's."""
    marker = tmp_path / "exit-handler-ran"
    program = (
        "import atexit, pathlib, sys\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'yes')\n"
        "from deepboot.cli.main import entry\n"
        "sys.argv = ['deepboot', *sys.argv[1:]]\n"
        "entry()\n"
    )
    listed = subprocess.run(
        [sys.executable, "-c", program, "policies"], capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    assert marker.read_text() == "yes"
    assert "pollux" in listed.stdout and listed.stdout.endswith("\n")
    marker.unlink()
    bad = subprocess.run(
        [
            sys.executable,
            "-c",
            program,
            "simulate",
            "--workload",
            str(tmp_path / "no.csv"),
            "--policy",
            "pollux",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert marker.read_text() == "yes"
    assert bad.stderr.startswith("deepboot: error: ")


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is absent")
def test_catalog_fit_writes_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "catalog.json"
    code, stdout, err = run_cli(
        capsys, "catalog", "fit", "--profiles", str(TRACES / "profiles"), "--out", str(out)
    )
    assert code == 0, err
    assert f"wrote {out}" in stdout
    assert json.loads(out.read_text(encoding="utf-8"))
