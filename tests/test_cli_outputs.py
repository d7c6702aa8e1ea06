"""What the ``deepboot`` command writes (issue 9, classes 2 and 3).

* Every output is written atomically: a failed write (here a real ``EFBIG`` from a
  file-size limit) leaves the previous file and no temporary file behind, and ends
  with one error line and exit 2.
* No output is ever written onto an input of the same run (same path, symbolic or
  hard link, or inside an input directory).
* An empty path argument is an error, never "the default".
* The catalog shipped in the package is written only by ``catalog fit
  --update-shipped-catalog``.
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import (
    POLLUX_HEADER,
    assert_one_line_error,
    make_philly,
    make_workload,
    run_cli,
)

SHIPPED_CATALOG = Path(__file__).resolve().parents[1] / "deepboot" / "perf" / "catalog.json"
PREVIOUS = "previous content\n"

# A toy profile folder (one model, "toy"): enough for `catalog fit`.
PLACEMENTS = """placement,local_bsz,step_time,sync_time
1,4,0.5,0.0
1,8,0.9,0.0
2,4,0.7,0.2
2,8,1.1,0.2
11,4,1.5,1.0
11,8,1.9,1.0
"""
SCALABILITY = """num_nodes,num_replicas,local_bsz,step_time,sync_time
3,3,4,2.5,2.0
3,3,8,2.9,2.0
"""
VALIDATION = {
    8: "progress,iteration,metric,grad_sqr,grad_var\n10.0,10,0.5,2.0,4.0\n20.0,20,0.6,1.0,8.0\n",
    16: "progress,iteration,metric,grad_sqr,grad_var\n11.0,6,0.5,4.0,6.0\n21.0,11,0.6,3.0,12.0\n",
}


def make_profiles(root: Path) -> Path:
    folder = root / "toy"
    folder.mkdir(parents=True)
    (folder / "placements.csv").write_text(PLACEMENTS, encoding="utf-8")
    (folder / "scalability.csv").write_text(SCALABILITY, encoding="utf-8")
    for bsz, text in VALIDATION.items():
        (folder / f"validation-{bsz}.csv").write_text(text, encoding="utf-8")
    return root


def snapshot(*roots: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``roots``: path -> (size, sha256); symlinks by their target."""
    files: dict[str, tuple[int, str]] = {}
    for root in roots:
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*"))
        for p in paths:
            if p.is_symlink():
                files[str(p)] = (-1, os.readlink(p))
            elif p.is_file():
                data = p.read_bytes()
                files[str(p)] = (len(data), hashlib.sha256(data).hexdigest())
    return files


@pytest.fixture
def shipped_catalog_guard() -> Iterator[None]:
    """Fail (and repair the file) if a test changed the catalog shipped in the package."""
    before = SHIPPED_CATALOG.read_bytes()
    yield
    after = SHIPPED_CATALOG.read_bytes() if SHIPPED_CATALOG.exists() else b""
    if after != before:
        SHIPPED_CATALOG.write_bytes(before)
        pytest.fail("the shipped catalog was rewritten")


# ------------------------------------------------------------------ atomic writes


def test_write_atomic_keeps_the_previous_file_when_the_writer_fails(tmp_path: Path) -> None:
    from deepboot.cli.files import write_atomic
    from deepboot.core.errors import InputError

    target = tmp_path / "out.json"
    target.write_text(PREVIOUS, encoding="utf-8")

    def half_then_full_disk(path: Path) -> None:
        path.write_text("half of the new cont", encoding="utf-8")
        raise OSError(28, "No space left on device")

    with pytest.raises(InputError, match="out.json: cannot write: No space left on device"):
        write_atomic(target, half_then_full_disk)
    assert target.read_text(encoding="utf-8") == PREVIOUS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_write_atomic_replaces_through_a_symlink_and_keeps_the_mode(tmp_path: Path) -> None:
    from deepboot.cli.files import write_text

    real = tmp_path / "real.json"
    real.write_text(PREVIOUS, encoding="utf-8")
    real.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text(link, "new\n")
    assert link.is_symlink()
    assert real.read_text(encoding="utf-8") == "new\n"
    assert real.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def _limit_file_size(limit: int) -> None:
    """preexec_fn: writes past ``limit`` bytes fail with EFBIG (SIGXFSZ ignored)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _case_argv(case: str, tmp: Path) -> tuple[list[str], Path]:
    """The command of ``case`` and the output it must fail to write."""
    if case == "simulate-summary-json":
        workload = make_workload(tmp / "w.csv")
        target = tmp / "summary.json"
        argv = ["simulate", "--workload", str(workload), "--policy", "pollux",
                "--cluster", "1x4", "--quiet", "--summary-json", str(target)]  # fmt: skip
    elif case == "from-philly-out":
        philly = make_philly(tmp / "philly.csv")
        target = tmp / "workload.csv"
        argv = ["workload", "from-philly", "--philly", str(philly), "--jobs", "12",
                "--hours", "1", "--out", str(target)]  # fmt: skip
    elif case == "catalog-fit-out":
        profiles = make_profiles(tmp / "profiles")
        target = tmp / "catalog.json"
        argv = ["catalog", "fit", "--profiles", str(profiles), "--out", str(target)]
    else:  # compare: the first file it writes is a run's summary
        workload = make_workload(tmp / "w.csv")
        target = tmp / "out" / "summaries" / "w--pollux.json"
        target.parent.mkdir(parents=True)
        argv = ["compare", "--workload", str(workload), "--run", "pollux",
                "--cluster", "2x4", "--inference-nodes", "1", "--procs", "1",
                "--no-figures", "--quiet", "--out", str(tmp / "out")]  # fmt: skip
    return argv, target


@pytest.mark.parametrize(
    "case", ["simulate-summary-json", "from-philly-out", "catalog-fit-out", "compare-out"]
)
def test_a_failed_write_keeps_the_previous_output(tmp_path: Path, case: str) -> None:
    """A real EFBIG (file-size limit) in a subprocess: previous file intact, no temp file."""
    argv, target = _case_argv(case, tmp_path)
    target.write_text(PREVIOUS, encoding="utf-8")
    before = snapshot(tmp_path)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from deepboot.cli.main import main; "
         "sys.exit(main(sys.argv[1:]))", *argv],
        capture_output=True, text=True, timeout=300, check=False, env=env,
        preexec_fn=lambda: _limit_file_size(64),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, f"{target}: cannot write: File too large")
    assert target.read_text(encoding="utf-8") == PREVIOUS
    assert snapshot(tmp_path) == before  # no temporary file left, nothing else changed


def test_outputs_are_complete_files_after_a_normal_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv, target = _case_argv("from-philly-out", tmp_path)
    target.write_text(PREVIOUS, encoding="utf-8")
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert target.read_text(encoding="utf-8").startswith(POLLUX_HEADER + "\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["philly.csv", "workload.csv"]


# ------------------------------------------------------------------ outputs onto inputs


def _onto_input_case(case: str, tmp: Path) -> tuple[list[str], list[str]]:
    """The command of ``case`` and the words its error must hold."""
    workload = make_workload(tmp / "w.csv")
    simulate = ["simulate", "--workload", str(workload), "--policy", "pollux", "--cluster",
                "1x4", "--quiet", "--summary-json"]  # fmt: skip
    if case == "philly-out-is-philly":
        philly = make_philly(tmp / "x.csv")
        argv = ["workload", "from-philly", "--philly", str(philly), "--jobs", "5",
                "--hours", "1", "--out", str(philly)]  # fmt: skip
        return argv, [f"--out {philly}", f"--philly {philly}"]
    if case == "summary-is-workload":
        return [*simulate, str(workload)], [f"--summary-json {workload}", f"--workload {workload}"]
    if case == "summary-is-symlink-to-workload":
        link = tmp / "summary.json"
        link.symlink_to(workload)
        return [*simulate, str(link)], [f"--summary-json {link}", f"--workload {workload}"]
    if case == "summary-is-hard-link-to-workload":
        link = tmp / "summary.json"
        os.link(workload, link)
        return [*simulate, str(link)], [f"--summary-json {link}", f"--workload {workload}"]
    if case == "summary-in-profiles":
        profiles = make_profiles(tmp / "profiles")
        out = profiles / "toy" / "placements.csv"
        argv = [*simulate[:-1], "--profiles", str(profiles), "--summary-json", str(out)]
        return argv, [f"--summary-json {out}", str(profiles)]
    if case == "compare-out-holds-workload":
        results = make_workload(tmp / "results.csv")
        argv = ["compare", "--workload", str(results), "--run", "pollux", "--cluster", "2x4",
                "--inference-nodes", "1", "--procs", "1", "--no-figures", "--quiet",
                "--out", str(tmp)]  # fmt: skip
        return argv, [f"--out {results}", f"--workload {results}"]
    if case == "compare-summary-is-workload":
        (tmp / "summaries").mkdir()
        inner = make_workload(tmp / "summaries" / "w--pollux.json")
        argv = ["compare", "--workload", str(workload), "--workload", str(inner),
                "--run", "pollux", "--cluster", "2x4", "--inference-nodes", "1", "--procs",
                "1", "--no-figures", "--quiet", "--out", str(tmp)]  # fmt: skip
        return argv, [str(inner), "--workload"]
    if case == "catalog-out-is-a-profile":
        profiles = make_profiles(tmp / "profiles")
        out = profiles / "toy" / "validation-8.csv"
        return ["catalog", "fit", "--profiles", str(profiles), "--out", str(out)], [
            f"--out {out}",
            "--profiles",
        ]
    assert case == "catalog-out-inside-profiles"
    profiles = make_profiles(tmp / "profiles")
    out = profiles / "catalog.json"
    return ["catalog", "fit", "--profiles", str(profiles), "--out", str(out)], [
        f"--out {out}",
        f"--profiles {profiles}",
    ]


@pytest.mark.parametrize(
    "case",
    [
        "philly-out-is-philly",
        "summary-is-workload",
        "summary-is-symlink-to-workload",
        "summary-is-hard-link-to-workload",
        "summary-in-profiles",
        "compare-out-holds-workload",
        "compare-summary-is-workload",
        "catalog-out-is-a-profile",
        "catalog-out-inside-profiles",
    ],
)
def test_an_output_never_overwrites_an_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str
) -> None:
    argv, words = _onto_input_case(case, tmp_path)
    before = snapshot(tmp_path)
    code, _, err = run_cli(capsys, *argv)
    assert code == 2, err
    assert_one_line_error(err, *words)
    assert snapshot(tmp_path) == before


def test_the_shipped_catalog_is_an_input_of_a_run_without_profiles(tmp_path: Path) -> None:
    from deepboot.cli.files import PathArg, check_outputs, model_inputs
    from deepboot.core.errors import ConfigError

    link = tmp_path / "catalog-link.json"
    link.symlink_to(SHIPPED_CATALOG)
    with pytest.raises(ConfigError, match="built-in catalog"):
        check_outputs([PathArg("--summary-json", str(link))], model_inputs(None))
    check_outputs([PathArg("--summary-json", str(tmp_path / "s.json"))], model_inputs(None))


def test_compare_out_beside_its_workload_is_fine(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    workload = make_workload(tmp_path / "w.csv")
    before = workload.read_bytes()
    code, _, err = run_cli(
        capsys, "compare", "--workload", str(workload), "--run", "pollux", "--cluster", "2x4",
        "--inference-nodes", "1", "--procs", "1", "--no-figures", "--quiet",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    assert workload.read_bytes() == before
    assert (tmp_path / "results.csv").is_file()
    assert (tmp_path / "summaries" / "w--pollux.json").is_file()
    assert not list(tmp_path.rglob(".*.tmp"))


# ------------------------------------------------------------------ empty paths


def _blank_case(case: str, tmp: Path) -> list[str]:
    workload = str(make_workload(tmp / "w.csv"))
    philly = str(make_philly(tmp / "philly.csv"))
    profiles = str(make_profiles(tmp / "profiles"))
    simulate = ["simulate", "--policy", "pollux", "--cluster", "1x4", "--quiet"]
    from_philly = ["workload", "from-philly", "--jobs", "5", "--hours", "1"]
    compare = ["compare", "--run", "pollux", "--cluster", "2x4", "--inference-nodes", "1",
               "--procs", "1", "--no-figures", "--quiet"]  # fmt: skip
    return {
        "simulate --workload": [*simulate, "--workload", ""],
        "simulate --summary-json": [*simulate, "--workload", workload, "--summary-json", ""],
        "simulate --summary-json blank": [*simulate, "--workload", workload, "--summary-json", " "],
        "simulate --profiles": [*simulate, "--workload", workload, "--profiles", ""],
        "from-philly --out": [*from_philly, "--philly", philly, "--out", ""],
        "from-philly --philly": [*from_philly, "--philly", "", "--out", str(tmp / "o.csv")],
        "catalog fit --out": ["catalog", "fit", "--profiles", profiles, "--out", ""],
        "catalog fit --profiles": ["catalog", "fit", "--profiles", "", "--out", "c.json"],
        "compare --out": [*compare, "--workload", workload, "--out", ""],
        "compare --workload": [*compare, "--workload", "", "--out", str(tmp / "o")],
        "compare --profiles": [*compare, "--workload", workload, "--profiles", "", "--out",
                               str(tmp / "o")],
    }[case]  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        "simulate --workload",
        "simulate --summary-json",
        "simulate --summary-json blank",
        "simulate --profiles",
        "from-philly --out",
        "from-philly --philly",
        "catalog fit --out",
        "catalog fit --profiles",
        "compare --out",
        "compare --workload",
        "compare --profiles",
    ],
)
def test_an_empty_path_is_an_error_not_the_default(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    shipped_catalog_guard: None,
    case: str,
) -> None:
    argv = _blank_case(case, tmp_path)
    monkeypatch.chdir(tmp_path)  # "" would mean the working directory
    before = snapshot(tmp_path)
    code, _, err = run_cli(capsys, *argv)
    assert code == 2, err
    assert_one_line_error(err, case.split()[-2 if case.endswith("blank") else -1], "is empty")
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------ the shipped catalog


def test_catalog_fit_without_out_no_longer_writes_the_shipped_catalog(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, shipped_catalog_guard: None
) -> None:
    profiles = make_profiles(tmp_path / "profiles")
    code, _, err = run_cli(capsys, "catalog", "fit", "--profiles", str(profiles))
    assert code == 2, err
    assert_one_line_error(err, "--out FILE", "--update-shipped-catalog")


def test_catalog_fit_out_refuses_the_shipped_catalog(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, shipped_catalog_guard: None
) -> None:
    profiles = make_profiles(tmp_path / "profiles")
    link = tmp_path / "shipped.json"
    link.symlink_to(SHIPPED_CATALOG)
    for target in (SHIPPED_CATALOG, link):
        code, _, err = run_cli(
            capsys, "catalog", "fit", "--profiles", str(profiles), "--out", str(target)
        )
        assert code == 2, err
        assert_one_line_error(err, "shipped", "--update-shipped-catalog")


def test_catalog_fit_out_and_update_flag_exclude_each_other(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, shipped_catalog_guard: None
) -> None:
    profiles = make_profiles(tmp_path / "profiles")
    code, _, err = run_cli(
        capsys, "catalog", "fit", "--profiles", str(profiles), "--out",
        str(tmp_path / "c.json"), "--update-shipped-catalog",
    )  # fmt: skip
    assert code == 2
    assert "not allowed with" in err
    assert not (tmp_path / "c.json").exists()


def test_update_shipped_catalog_writes_the_packaged_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepboot.cli import commands
    from deepboot.perf.catalog import load_catalog

    profiles = make_profiles(tmp_path / "profiles")
    fake = tmp_path / "package" / "catalog.json"
    fake.parent.mkdir()
    fake.write_text(PREVIOUS, encoding="utf-8")
    monkeypatch.setattr(commands, "shipped_catalog", lambda: fake)
    code, out, err = run_cli(
        capsys, "catalog", "fit", "--profiles", str(profiles), "--update-shipped-catalog"
    )
    assert code == 0, err
    assert f"wrote {fake}" in out
    assert sorted(load_catalog(fake)) == ["toy"]
    assert sorted(p.name for p in fake.parent.iterdir()) == ["catalog.json"]


def test_catalog_fit_help_documents_both_targets(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "catalog", "fit", "--help")
    assert code == 0
    for word in ("--out FILE", "--update-shipped-catalog", "examples:", "catalog.json"):
        assert word in out


def test_write_catalog_is_atomic(tmp_path: Path) -> None:
    """perf's own writer (kept for library use) leaves the previous file on failure."""
    from deepboot.perf.catalog import write_catalog

    profiles = make_profiles(tmp_path / "profiles")
    target = tmp_path / "catalog.json"
    target.write_text(PREVIOUS, encoding="utf-8")
    before = snapshot(tmp_path)
    code = (
        "import sys; from deepboot.perf.catalog import write_catalog\n"
        "try:\n    write_catalog(sys.argv[1], sys.argv[2])\n"
        "except OSError as e:\n    sys.exit(e.errno)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(profiles), str(target)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=lambda: _limit_file_size(64),
    )  # fmt: skip
    assert proc.returncode == 27, proc.stderr  # EFBIG
    assert snapshot(tmp_path) == before
    assert write_catalog(profiles, target) == target
    assert target.read_text(encoding="utf-8").startswith("{")


# ------------------------------------------------------------------ missing directories


def test_an_output_in_a_missing_directory_makes_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--out out/w.csv`` on a fresh clone: ``out/`` is made, as ``mkdir -p``."""
    philly = make_philly(tmp_path / "philly.csv")
    target = tmp_path / "out" / "deeper" / "w.csv"
    code, _, err = run_cli(
        capsys, "workload", "from-philly", "--philly", str(philly),
        "--jobs", "3", "--hours", "1", "--out", str(target),
    )  # fmt: skip
    assert code == 0, err
    assert target.read_text().startswith("name,")


def test_an_output_whose_directory_is_a_file_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    philly = make_philly(tmp_path / "philly.csv")
    (tmp_path / "out").write_text("a file\n")
    code, _, err = run_cli(
        capsys, "workload", "from-philly", "--philly", str(philly),
        "--jobs", "3", "--hours", "1", "--out", str(tmp_path / "out" / "w.csv"),
    )  # fmt: skip
    assert code == 2
    assert_one_line_error(err, "--out", "is a file, not a directory")
