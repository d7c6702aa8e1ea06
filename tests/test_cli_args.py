"""The numeric flags of the ``deepboot`` command: a documented range, checked at the
boundary with one error line and exit 2, never a traceback (issue 9, class 4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import (
    assert_one_line_error,
    make_philly,
    make_workload,
    run_cli,
)


def command(kind: str, tmp: Path) -> list[str]:
    """A valid, fast command line of ``kind`` (simulate, compare or from-philly)."""
    if kind == "simulate":
        workload = make_workload(tmp / "w.csv")
        return ["simulate", "--workload", str(workload), "--policy", "pollux",
                "--cluster", "2x4", "--quiet"]  # fmt: skip
    if kind == "compare":
        workload = make_workload(tmp / "w.csv")
        return ["compare", "--workload", str(workload), "--run", "pollux", "--cluster",
                "2x4", "--inference-nodes", "1", "--procs", "1", "--no-figures", "--quiet",
                "--out", str(tmp / "out")]  # fmt: skip
    assert kind == "from-philly"
    philly = make_philly(tmp / "philly.csv")
    return ["workload", "from-philly", "--philly", str(philly), "--jobs", "5", "--hours", "1",
            "--out", str(tmp / "out.csv")]  # fmt: skip


@pytest.mark.parametrize("kind", ["simulate", "compare", "from-philly"])
@pytest.mark.parametrize("seed", ["-1", str(2**63), str(-(2**70))])
def test_a_seed_out_of_range_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str, seed: str
) -> None:
    code, _, err = run_cli(capsys, *command(kind, tmp_path), "--seed", seed)
    assert code == 2, err
    assert_one_line_error(err, "--seed", "[0, 2**63)", seed)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("kind", ["simulate", "from-philly"])
def test_the_largest_seed_is_accepted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    code, _, err = run_cli(capsys, *command(kind, tmp_path), "--seed", str(2**63 - 1))
    assert code == 0, err


# (command, extra flags, words of the error)
OUT_OF_RANGE = [
    ("simulate", ["--interval", "0"], ["--interval", "(0, 86400]"]),
    ("simulate", ["--interval", "nan"], ["--interval"]),
    ("simulate", ["--interval", "inf"], ["--interval"]),
    ("simulate", ["--interval", "86401"], ["--interval", "(0, 86400]"]),
    ("compare", ["--interval", "1e7"], ["--interval", "(0, 86400]"]),
    ("simulate", ["--max-time", "0"], ["--max-time", "(0, 1e9]"]),
    ("simulate", ["--max-time", "1e18"], ["--max-time", "(0, 1e9]"]),
    ("compare", ["--max-time", "0"], ["--max-time", "(0, 1e9]"]),
    ("compare", ["--max-time", "-5"], ["--max-time"]),
    ("compare", ["--max-time", "nan"], ["--max-time"]),
    ("compare", ["--max-time", "inf"], ["--max-time"]),
    ("compare", ["--max-time", "1e18"], ["--max-time", "(0, 1e9]"]),
    ("compare", ["--procs", "0"], ["--procs", ">= 1 and <= 64"]),
    ("compare", ["--procs", "65"], ["--procs", ">= 1 and <= 64"]),
    ("simulate", ["--inference-nodes", "-1"], ["--inference-nodes", "[0, 1]"]),
    ("simulate", ["--inference-nodes", "2"], ["--inference-nodes", "[0, 1]"]),
    ("compare", ["--inference-nodes", "-1"], ["--inference-nodes"]),
    ("simulate", ["--cluster", "4097x1"], ["4097x1", "4096 nodes"]),
    ("simulate", ["--cluster", "1x65"], ["1x65", "64 GPUs per node"]),
    ("simulate", ["--cluster", "2048x64"], ["2048x64", "65,536 GPUs"]),
    ("simulate", ["--cluster", "1" + "0" * 5000 + "x4"], ["too large"]),
    ("compare", ["--cluster", "4096x64"], ["4096x64", "65,536 GPUs"]),
    ("simulate", ["--protect-factor", "-1"], ["--protect-factor", "[0, 100]"]),
    ("simulate", ["--protect-factor", "nan"], ["--protect-factor"]),
    ("simulate", ["--protect-factor", "101"], ["--protect-factor", "[0, 100]"]),
    ("compare", ["--run", "x=pollux:protect-factor=1e300"], ["protect-factor", "[0, 100]"]),
    ("simulate", ["--reserve-target", "1"], ["--reserve-target", "[0, 1)"]),
    ("simulate", ["--reserve-target", "-0.1"], ["--reserve-target"]),
    ("simulate", ["--reserve-target", "nan"], ["--reserve-target"]),
    ("from-philly", ["--jobs", "0"], ["--jobs", "[1, 100000]"]),
    ("from-philly", ["--jobs", "-3"], ["--jobs"]),
    ("from-philly", ["--jobs", "100001"], ["--jobs", "[1, 100000]"]),
    ("from-philly", ["--hours", "0"], ["--hours", "(0, 24]"]),
    ("from-philly", ["--hours", "nan"], ["--hours"]),
    ("from-philly", ["--hours", "inf"], ["--hours"]),
    ("from-philly", ["--start-hour", "24"], ["--start-hour", "[0, 23]"]),
    ("from-philly", ["--start-hour", "-1"], ["--start-hour"]),
]


@pytest.mark.parametrize(
    ("kind", "extra", "words"),
    OUT_OF_RANGE,
    ids=[f"{kind} {' '.join(extra)[:40]}" for kind, extra, _ in OUT_OF_RANGE],
)
def test_a_flag_out_of_its_range_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    kind: str,
    extra: list[str],
    words: list[str],
) -> None:
    argv = command(kind, tmp_path)
    if kind == "compare" and extra[0] == "--run":
        argv = [a for a in argv if a not in ("--run", "pollux")]
    code, _, err = run_cli(capsys, *argv, *extra)
    assert code == 2, err
    assert_one_line_error(err, *words)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["simulate", "--help"], ["2**63", "86400", "4096 nodes", "65,536 GPUs", "0 <= N <"]),
        (["simulate", "--help"], ["0 <= P <= 100", "0 <= Q < 1", "1e9"]),
        (["compare", "--help"], ["2**63", "86400", "1e9", "1 <= N <= 64", "4096 nodes"]),
        (["compare", "--help"], ["0 <= X <= 100", "0 <= Q < 1"]),
        (["workload", "from-philly", "--help"], ["2**63", "100,000", "0 < HOURS <= 24"]),
        (["workload", "from-philly", "--help"], ["0 <= H <= 23"]),
    ],
)
def test_help_states_each_range(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]
) -> None:
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    flat = " ".join(out.split())
    for word in words:
        assert word in flat, word


def test_simulate_max_time_stops_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run_cli(capsys, *command("simulate", tmp_path), "--max-time", "1")
    assert code == 0, err
    assert "0 / 1" in out  # the one job had no time to finish


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["simulate", "--workload", "w.csv", "--policy", "pollux", "--seed", "x"],
         ["argument --seed: invalid int value: 'x'", "'deepboot simulate --help'"]),
        (["compare", "--workload", "w.csv", "--out", "o", "--procs", "two"],
         ["argument --procs", "'deepboot compare --help'"]),
        (["frobnicate"], ["invalid choice: 'frobnicate'", "'deepboot --help'"]),
    ],
    ids=["simulate-seed", "compare-procs", "unknown-command"],
)  # fmt: skip
def test_argparse_errors_end_with_the_cli_error_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]
) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.startswith("usage: deepboot")
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("deepboot: error: "), err
    for word in words:
        assert word in last, (word, last)
