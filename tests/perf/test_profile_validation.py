"""Physically impossible profile values are refused at load time (issue 9, class 5).

Each case copies the small valid profile of :mod:`tests.perf.builders`, breaks one
value, and expects one :class:`InputError` naming the file, the 1-based line and the
column (line 0: the file as a whole). The valid ranges are in the docstring of
:mod:`deepboot.perf.profiles`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_cli

from deepboot.core.errors import InputError
from deepboot.perf.profiles import AppSettings, ProfiledApplication, load_profiles

from .builders import (
    PLACEMENTS_CSV,
    PROFILES,
    SCALABILITY_CSV,
    VALIDATION,
    validation_csv,
    write_profile,
)

# The builders' files, line by line (line 1 is the header):
#   placements.csv   2: 1,4,0.5,0.0   3: 1,8,0.9,0.0   4: 2,4,0.7,0.2 ...
#   scalability.csv  2: 3,3,4,2.5,2.0  3: 3,3,8,2.9,2.0  4: 3,6,4,3.5,3.0 ...
#   validation-8.csv 2: 10.0,10,0.5,2.0,4.0  3: 20.0,20,0.6,1.0,8.0
PLACEMENT_ROW = "2,4,0.7,0.2"  # line 4
SCALABILITY_ROW = "3,6,4,3.5,3.0"  # line 4
VALIDATION_ROW = "20.0,20,0.6,1.0,8.0"  # line 3 of validation-8.csv

# A profile whose measurements all lie on one node: no volume to interpolate in.
FLAT_PLACEMENTS = "placement,local_bsz,step_time,sync_time\n1,4,0.5,0.0\n2,4,0.7,0.2\n2,8,1.1,0.2\n"
FLAT_SCALABILITY = "num_nodes,num_replicas,local_bsz,step_time,sync_time\n1,4,4,0.9,0.3\n"


def placements(row: str) -> tuple[str, str]:
    assert PLACEMENT_ROW in PLACEMENTS_CSV
    return "placements.csv", PLACEMENTS_CSV.replace(PLACEMENT_ROW, row)


def scalability(row: str) -> tuple[str, str]:
    assert SCALABILITY_ROW in SCALABILITY_CSV
    return "scalability.csv", SCALABILITY_CSV.replace(SCALABILITY_ROW, row)


def validation(row: str) -> tuple[str, str]:
    assert VALIDATION_ROW + "\n" in VALIDATION[8]
    return "validation-8.csv", VALIDATION[8].replace(VALIDATION_ROW, row)


# (id, (file, new text), line, field, words in the message)
CASES: list[tuple[str, tuple[str, str], int, str, str]] = [
    # Step and sync times.
    ("step-over-a-day", placements("2,4,90000,0.2"), 4, "step_time", "in [1e-06, 86400]"),
    ("step-1e308", placements("2,4,1e308,0.2"), 4, "step_time", "86400"),
    ("step-below-a-microsecond", placements("2,4,1e-9,0.0"), 4, "step_time", "1e-06"),
    ("sync-over-a-day", placements("2,4,0.7,1e6"), 4, "sync_time", "86400"),
    ("scal-step-over-a-day", scalability("3,6,4,1e9,3.0"), 4, "step_time", "86400"),
    # Batch sizes, node and replica counts.
    ("local-bsz-absurd", placements("2,2000000,0.7,0.2"), 4, "local_bsz", "1e+06"),
    ("scal-local-bsz-absurd", scalability("3,6,1e7,3.5,3.0"), 4, "local_bsz", "1e+06"),
    ("placement-too-many-nodes", placements("1" * 4097 + ",4,0.7,0.2"), 4, "placement", "4096"),
    ("placement-unicode-digits", placements("\u0661\u0662,4,0.7,0.2"), 4, "placement", "1-9"),
    ("nodes-absurd", scalability("5000,6000,4,3.5,3.0"), 4, "num_nodes", "4096"),
    ("gpus-per-node", scalability("1,65,4,3.5,3.0"), 4, "num_replicas", "64 GPUs per node"),
    ("gpus-per-node-many-nodes", scalability("3,200,4,3.5,3.0"), 4, "num_replicas", "64"),
    # Gradient statistics: squared norms, never negative; overflow guards.
    ("grad-sqr-negative", validation("20.0,20,0.6,-1.0,8.0"), 3, "grad_sqr", "0 or in [1e-30"),
    ("grad-var-negative", validation("20.0,20,0.6,1.0,-8.0"), 3, "grad_var", "in [0, 1e+30]"),
    ("grad-sqr-denormal", validation("20.0,20,0.6,1e-300,8.0"), 3, "grad_sqr", "1e-30"),
    ("grad-sqr-huge", validation("20.0,20,0.6,1e300,8.0"), 3, "grad_sqr", "1e+30"),
    ("grad-var-huge", validation("20.0,20,0.6,1.0,1e300"), 3, "grad_var", "1e+30"),
    # Progress and iteration counts are cumulative.
    ("progress-decreases", validation("5.0,20,0.6,1.0,8.0"), 3, "progress", "previous epoch"),
    ("progress-stalls", validation("10.0,20,0.6,1.0,8.0"), 3, "progress", "must grow"),
    ("progress-absurd", validation("1e300,20,0.6,1.0,8.0"), 3, "progress", "1e+15"),
    ("iteration-decreases", validation("20.0,5,0.6,1.0,8.0"), 3, "iteration", "cumulative"),
    ("iteration-negative", validation("20.0,-20,0.6,1.0,8.0"), 3, "iteration", "in [0, 1e+15]"),
    # Whole-file problems (line 0).
    ("batch-absurd", ("validation-10000000000.csv", VALIDATION[8]), 0, "", "[1, 1e+09]"),
    # validation-08.csv would be a second file for B = 8.
    ("batch-leading-zero", ("validation-08.csv", VALIDATION[8]), 0, "", "leading zeros"),
]


@pytest.mark.parametrize(
    ("broken", "line", "field", "words"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_impossible_value_names_file_line_and_field(
    tmp_path: Path, broken: tuple[str, str], line: int, field: str, words: str
) -> None:
    folder = write_profile(tmp_path)
    file, text = broken
    (folder / file).write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_profiles(tmp_path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(folder / file), line, field)
    assert words in err.message
    assert "\n" not in str(err)
    where = f"{folder / file}:{line}: field '{field}':" if line else f"{folder / file}: "
    assert str(err).startswith(where)


def test_measurements_in_one_plane_are_refused_at_load_time(tmp_path: Path) -> None:
    # Before: the folder loaded and the first multi-node query died in scipy's qhull.
    folder = write_profile(tmp_path, placements=FLAT_PLACEMENTS, scalability=FLAT_SCALABILITY)
    with pytest.raises(InputError) as info:
        load_profiles(tmp_path)
    assert (info.value.path, info.value.line) == (str(folder / "scalability.csv"), 0)
    assert "one plane" in info.value.message


def test_inconsistent_settings_name_the_folder(tmp_path: Path) -> None:
    folder = write_profile(tmp_path)
    with pytest.raises(InputError) as info:
        ProfiledApplication.from_dir(folder, AppSettings(min_local_bsz=10, max_local_bsz=5))
    assert info.value.path == str(folder)
    assert "inconsistent batch limits" in info.value.message


def test_the_edges_of_the_ranges_are_accepted(tmp_path: Path) -> None:
    # A zero grad_sqr (the reference deepspeech2 has it), a zero grad_var, a sync time
    # equal to the step time, 64 GPUs a node, a step of exactly one day.
    edges = validation_csv([(10.0, 10, -3.5, 0.0, 0.0), (20.0, 10, 0.6, 1e-30, 1e30)])
    folder = write_profile(
        tmp_path,
        placements=PLACEMENTS_CSV.replace(PLACEMENT_ROW, "2,4,0.7,0.7"),
        scalability=SCALABILITY_CSV.replace(SCALABILITY_ROW, "3,192,4,86400,3.0"),
        validation={8: edges, 16: VALIDATION[16]},
    )
    app = load_profiles(tmp_path)[folder.name]
    assert app.grad_stats(8, 0) == (0.0, 0.0)
    assert app.step_time((2,), 4) == (0.7, 0.7)


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    # Spreadsheets save one before the header, as the workload and Philly loaders allow.
    folder = write_profile(tmp_path, placements="\ufeff" + PLACEMENTS_CSV)
    assert load_profiles(tmp_path)[folder.name].step_time((2,), 4) == (0.7, 0.2)


def test_the_cli_prints_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_profile(tmp_path / "profiles")
    file, text = validation("20.0,20,0.6,-1.0,8.0")
    (folder / file).write_text(text, encoding="utf-8")
    workload = tmp_path / "w.csv"
    workload.write_text("name,time,application,num_replicas,batch_size\nj,0,toy,1,8\n")
    argv = ["simulate", "--workload", str(workload), "--policy", "pollux"]
    argv += ["--profiles", str(tmp_path / "profiles")]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert_one_line_error(err, f"{folder / file}:3: field 'grad_sqr':")


@pytest.mark.skipif(not PROFILES.is_dir(), reason="reference traces not present")
def test_the_reference_profiles_pass_every_check() -> None:
    apps = load_profiles(PROFILES)
    # deepspeech2's validation-20.csv holds grad_sqr == 0: kept, not refused.
    assert any(float(v) == 0.0 for t in apps["deepspeech2"].data.validation for v in t.grad_sqr)
