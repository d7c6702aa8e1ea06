"""ProfiledApplication: the reference interpolation rules, and typed input errors."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from deepboot.core.errors import InputError
from deepboot.perf.profiles import (
    APP_SETTINGS,
    AppSettings,
    ProfiledApplication,
    canonical_shape,
    load_profiles,
)

from .builders import PLACEMENTS_CSV, PROFILES, SCALABILITY_CSV, VALIDATION, write_profile

needs_traces = pytest.mark.skipif(not PROFILES.is_dir(), reason="reference traces not present")


@pytest.fixture
def toy(tmp_path: Path) -> ProfiledApplication:
    return ProfiledApplication.from_dir(write_profile(tmp_path))


@pytest.mark.parametrize(
    ("shape", "expected"),
    [((1,), (1,)), ((2, 1, 1), (1, 1, 2)), ((0, 2, 0, 1), (1, 2)), ((1, 3, 1, 2), (1, 2, 1, 3))],
    ids=str,
)
def test_canonical_shape_is_smallest_rotation(
    shape: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    assert canonical_shape(shape) == expected


def test_canonical_shape_rejects_empty() -> None:
    with pytest.raises(ValueError):
        canonical_shape((0, 0))


def test_limits_epochs_and_settings(toy: ProfiledApplication) -> None:
    # Validated batch sizes 8 and 16; per-GPU batches 4 and 8; 2 rows per validation file.
    assert toy.name == "toy"
    assert (toy.limits.init_batch_size, toy.limits.max_batch_size) == (8, 16)
    assert (toy.limits.min_local_bsz, toy.limits.max_local_bsz) == (4, 8)
    assert toy.max_epochs == 2


def test_settings_override_the_data(tmp_path: Path) -> None:
    app = ProfiledApplication.from_dir(
        write_profile(tmp_path), AppSettings(max_epochs=1, max_local_bsz=6)
    )
    assert app.limits.max_local_bsz == 6
    assert app.max_epochs == 1


@pytest.mark.parametrize(
    ("shape", "bsz", "expected"),
    [
        # Measured placement "2": rows (4, 0.7, 0.2) and (8, 1.1, 0.2).
        ((2,), 4, (0.7, 0.2)),
        ((2,), 6, (0.9, 0.2)),
        # Rotations are the same placement: (1, 1) is "11".
        ((1, 1), 8, (1.9, 1.0)),
        # Above the range: compute 0.9 at 8 grows with slope (0.9 - 0.5) / 4 = 0.1 per
        # sample -> 1.3 at 12; sync held at 0.2.
        ((2,), 12, (1.5, 0.2)),
        # Below the range: compute scales with the batch, 0.5 * 2 / 4 = 0.25.
        ((2,), 2, (0.45, 0.2)),
        # Not measured as a placement: 3 nodes x 1 GPU is the scalability point (3, 3, 4).
        ((1, 1, 1), 4, (2.5, 2.0)),
        # ... and half-way along the hull edge (3, 3, 4)-(3, 3, 8).
        ((1, 1, 1), 6, (2.7, 2.0)),
    ],
    ids=["exact", "exact-mid", "rotation", "extrapolate-up", "extrapolate-down", "nd", "nd-mid"],
)
def test_step_time(
    toy: ProfiledApplication, shape: tuple[int, ...], bsz: int, expected: tuple[float, float]
) -> None:
    step, sync = toy.step_time(shape, bsz)
    assert step == pytest.approx(expected[0])
    assert sync == pytest.approx(expected[1])
    # Memoized answers are the same.
    assert toy.step_time(shape, bsz) == (step, sync)


def test_step_time_outside_the_hull_uses_the_nearest_measurement(
    toy: ProfiledApplication,
) -> None:
    # 20 nodes are capped to 16, far outside the measured 1-3 nodes.
    step, sync = toy.step_time((1,) * 20, 4)
    assert (step, sync) == pytest.approx((3.5, 3.0))


@pytest.mark.parametrize(
    ("batch", "epoch", "expected"),
    [
        # Validated 8: (sqr, var) = (2, 4), (1, 8); validated 16: (4, 6), (3, 12).
        (8, 0, (2.0, 4.0)),
        (16, 1, (3.0, 12.0)),
        # Half-way between 8 and 16.
        (12, 0, (3.0, 5.0)),
        (12, 1, (2.0, 10.0)),
        # Past the last epoch: the last row; outside the validated range: clamped.
        (12, 7, (2.0, 10.0)),
        (4, 0, (2.0, 4.0)),
        (64, 0, (4.0, 6.0)),
    ],
    ids=["lower", "upper", "mid-e0", "mid-e1", "late", "below", "above"],
)
def test_grad_stats(
    toy: ProfiledApplication, batch: int, epoch: int, expected: tuple[float, float]
) -> None:
    assert toy.grad_stats(batch, epoch) == pytest.approx(expected)


def test_progress_is_the_minimum_over_batch_sizes(toy: ProfiledApplication) -> None:
    # Progress columns: 8 -> (10, 20); 16 -> (11, 21). Past the data: +10 per epoch.
    assert [toy.progress_at(e) for e in range(4)] == [0.0, 10.0, 20.0, 30.0]


@needs_traces
@pytest.mark.parametrize("model", sorted(APP_SETTINGS))
def test_reproduces_every_measured_row(model: str) -> None:
    app = ProfiledApplication.from_dir(PROFILES / model)
    with (PROFILES / model / "placements.csv").open() as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        shape = tuple(int(c) for c in row["placement"])
        got = app.step_time(shape, int(row["local_bsz"]))
        assert got == (float(row["step_time"]), float(row["sync_time"])), row
    assert app.max_epochs == APP_SETTINGS[model].max_epochs
    # A 5-node placement is interpolated from the measurements: finite and positive.
    step, sync = app.step_time((4, 4, 4, 4, 4), app.limits.min_local_bsz)
    assert 0 <= sync < step


@needs_traces
def test_load_profiles_reads_every_model() -> None:
    apps = load_profiles(PROFILES)
    assert sorted(apps) == sorted(APP_SETTINGS)
    assert apps["yolov3"].limits.max_local_bsz == 8


def _break(folder: Path, file: str, text: str | None) -> None:
    path = folder / file
    if text is None:
        path.unlink()
    else:
        path.write_text(text)


BAD_CASES = [
    # (file, new content or None to delete, expected line, expected field)
    ("placements.csv", None, 0, ""),
    ("placements.csv", "", 1, "placement"),
    ("placements.csv", "placement,local_bsz,step_time,sync_time\n", 1, "placement"),
    ("placements.csv", PLACEMENTS_CSV.replace("step_time", "step"), 1, "step"),
    ("placements.csv", PLACEMENTS_CSV.replace("sync_time", "sync_time,extra"), 1, "extra"),
    ("placements.csv", PLACEMENTS_CSV.replace("2,4,0.7,0.2", "2,4,fast,0.2"), 4, "step_time"),
    ("placements.csv", PLACEMENTS_CSV.replace("2,4,0.7,0.2", "2,4,0.7"), 4, "sync_time"),
    ("placements.csv", PLACEMENTS_CSV.replace("2,4,0.7,0.2", "2,4,0.7,0.2,9"), 4, "sync_time"),
    ("placements.csv", PLACEMENTS_CSV.replace("2,4,0.7,0.2", "2,4.5,0.7,0.2"), 4, "local_bsz"),
    ("placements.csv", PLACEMENTS_CSV.replace("2,4,0.7,0.2", "2,4,0.7,0.9"), 4, "sync_time"),
    ("placements.csv", PLACEMENTS_CSV.replace("2,4,0.7,0.2", "20,4,0.7,0.2"), 4, "placement"),
    ("placements.csv", PLACEMENTS_CSV.replace("2,4,0.7,0.2", "2,4,nan,0.2"), 4, "step_time"),
    ("scalability.csv", None, 0, ""),
    ("scalability.csv", SCALABILITY_CSV.replace("3,6,4,3.5", "3,6,x,3.5"), 4, "local_bsz"),
    ("scalability.csv", SCALABILITY_CSV.replace("3,6,4,3.5", "7,6,4,3.5"), 4, "num_nodes"),
    ("validation-8.csv", VALIDATION[8].replace("8.0\n", "lots\n"), 3, "grad_var"),
    ("validation-8.csv", VALIDATION[8].replace("progress", "progres"), 1, "progres"),
    ("validation-big.csv", "whatever\n", 0, ""),
]


@pytest.mark.parametrize(
    ("file", "text", "line", "field"),
    BAD_CASES,
    ids=[
        "missing-placements",
        "empty",
        "header-only",
        "bad-header",
        "extra-column",
        "non-numeric",
        "short-row",
        "long-row",
        "fractional-bsz",
        "sync-above-step",
        "zero-digit",
        "nan",
        "missing-scalability",
        "scalability-non-numeric",
        "nodes-above-replicas",
        "validation-non-numeric",
        "validation-header",
        "validation-name",
    ],
)
def test_input_errors_name_file_line_and_field(
    tmp_path: Path, file: str, text: str | None, line: int, field: str
) -> None:
    folder = write_profile(tmp_path)
    _break(folder, file, text)
    with pytest.raises(InputError) as info:
        load_profiles(tmp_path)
    err = info.value
    assert Path(err.path).name == file
    assert (err.line, err.field) == (line, field)
    assert file in str(err)


def test_missing_root_and_empty_root_and_no_validation(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_profiles(tmp_path / "nope")
    assert info.value.path.endswith("nope")
    with pytest.raises(InputError) as info:
        load_profiles(tmp_path)
    assert info.value.path == str(tmp_path)
    folder = write_profile(tmp_path, validation={})
    with pytest.raises(InputError) as info:
        load_profiles(tmp_path)
    assert info.value.path == str(folder)


def test_linear_3d_matches_scipy_on_a_degenerate_grid() -> None:
    # A regular grid is full of co-spherical points: the triangulation has flat slivers
    # and the interpolant jumps across grid planes, so the simplex choice matters.
    from scipy.interpolate import LinearNDInterpolator

    from deepboot.perf.profiles import _Linear3D

    grid = np.array(
        [(n, k, m) for n in (1, 2, 4) for k in (1, 3, 4) for m in (4, 8, 16)], dtype=np.float64
    )
    values = np.column_stack([grid[:, 0] * grid[:, 1] ** 2 + grid[:, 2], np.sqrt(grid.sum(1))])
    mine = _Linear3D(grid, values)
    ref = LinearNDInterpolator(grid, values)
    queries = [(n, k, m) for n in (1, 2, 3, 4, 5) for k in (1, 2, 3, 4) for m in (4, 6, 8, 12, 20)]
    for q in queries:
        x = np.array(q, dtype=np.float64)
        expected = ref(x)[0]
        got = mine(x)
        if np.all(np.isfinite(expected)):
            assert got is not None, q
            np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=str(q))
        else:
            assert got is None, q
