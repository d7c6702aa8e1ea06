"""Figures from hand-made data: the data reductions exactly, the PNGs by their pixels."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.report import figures
from deepboot.report.figures import (
    USAGE_LAYERS,
    MissingDependencyError,
    UsagePanel,
    cdf_points,
    cumulative_counts,
    gpu_usage_figure,
    jct_cdf_figure,
    reclaims_figure,
    usage_segments,
)

from .builders import Point

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_pixels(png: bytes) -> np.ndarray:
    """RGB pixels (h, w, 3) in 0..255 of a PNG."""
    from matplotlib.image import imread

    rgba = np.asarray(imread(io.BytesIO(png), format="png"), dtype=np.float64)
    return np.rint(rgba[:, :, :3] * 255).astype(int)


def share_of_colour(png: bytes, hex_colour: str) -> float:
    """Fraction of the image's pixels within a small distance of ``hex_colour``."""
    target = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    pixels = png_pixels(png)
    close = np.abs(pixels - target).sum(axis=2) <= 12
    return float(close.mean())


def test_cdf_points_are_sorted_fractions_and_drop_nan() -> None:
    x, y = cdf_points([30.0, 10.0, float("nan"), 20.0])
    assert x.tolist() == [10.0, 20.0, 30.0]
    assert y.tolist() == pytest.approx([1 / 3, 2 / 3, 1.0])
    ex, ey = cdf_points([])
    assert ex.size == ey.size == 0


def test_cumulative_counts_start_at_zero() -> None:
    x, y = cumulative_counts([50.0, 10.0])
    assert x.tolist() == [0.0, 10.0, 50.0]
    assert y.tolist() == [0.0, 1.0, 2.0]


def test_usage_segments_keep_exact_steps_and_drop_zero_width() -> None:
    points = [
        Point(0.0, training=4, free=4),
        Point(10.0, training=2, free=6),
        Point(10.0, training=3, running=1, free=4),  # same instant: the later one holds
        Point(30.0, training=0, free=8),
    ]
    edges, values = usage_segments(points)
    assert edges.tolist() == [0.0, 10.0, 30.0]
    training = values[[layer.field for layer in USAGE_LAYERS].index("training")]
    running = values[[layer.field for layer in USAGE_LAYERS].index("running")]
    assert training.tolist() == [4.0, 3.0]
    assert running.tolist() == [0.0, 1.0]
    assert values.sum(axis=0).tolist() == [8.0, 8.0]


@pytest.mark.parametrize("bins", [1, 7, 50], ids=["one-bin", "seven-bins", "fifty-bins"])
def test_resampling_conserves_gpu_seconds(bins: int) -> None:
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.exponential(5.0, 400))
    points = []
    for ti in t:
        busy = int(rng.integers(0, 9))
        lent = int(rng.integers(0, 9 - busy))
        points.append(Point(float(ti), training=busy, lent=lent, free=16 - busy - lent))
    exact_edges, exact = usage_segments(points, max_segments=10_000)
    edges, values = usage_segments(points, max_segments=bins)
    assert values.shape == (len(USAGE_LAYERS), bins)
    assert edges[0] == exact_edges[0] and edges[-1] == exact_edges[-1]
    # GPU-seconds per band are the same before and after resampling...
    np.testing.assert_allclose(
        (values * np.diff(edges)).sum(axis=1), (exact * np.diff(exact_edges)).sum(axis=1)
    )
    # ...and every bin still accounts for all 16 GPUs.
    np.testing.assert_allclose(values.sum(axis=0), 16.0)


@pytest.mark.parametrize(
    "points",
    [[], [Point(5.0, free=8)], [Point(5.0, free=8), Point(5.0, training=8)]],
    ids=["empty", "one-point", "no-duration"],
)
def test_usage_segments_of_a_timeline_without_duration_are_empty(points: list[Point]) -> None:
    edges, values = usage_segments(points)
    assert edges.size == 0
    assert values.shape == (len(USAGE_LAYERS), 0)


def test_usage_segments_reject_unsorted_points() -> None:
    with pytest.raises(ValueError, match="sorted"):
        usage_segments([Point(10.0), Point(5.0)])


def test_jct_cdf_is_a_png_and_tolerates_a_run_without_jobs() -> None:
    png = jct_cdf_figure({"a": [600.0, 3600.0, 36000.0], "b": []}, title="t")
    assert png.startswith(PNG_MAGIC)
    assert png_pixels(png).shape[1] >= 800  # wide enough to read in the report


def test_usage_figure_draws_each_band_in_its_colour() -> None:
    colour = {layer.field: layer.color for layer in USAGE_LAYERS}
    all_training = [Point(0.0, training=64), Point(7200.0, training=64)]
    all_sleep = [Point(0.0, sleep=64), Point(7200.0, sleep=64)]
    png_training = gpu_usage_figure([UsagePanel.from_timeline("x", all_training, 32)])
    png_sleep = gpu_usage_figure([UsagePanel.from_timeline("x", all_sleep, 32)])
    assert share_of_colour(png_training, colour["training"]) > 0.2
    assert share_of_colour(png_training, colour["sleep"]) < 0.01
    assert share_of_colour(png_sleep, colour["sleep"]) > 0.2
    assert share_of_colour(png_sleep, colour["training"]) < 0.01


@pytest.mark.parametrize("runs", [1, 4, 5], ids=["one", "four-two-columns", "five-odd"])
def test_usage_figure_has_one_panel_per_run(runs: int) -> None:
    timeline = [Point(0.0, training=8, free=8), Point(3600.0, training=8, free=8)]
    panels = [UsagePanel.from_timeline(f"run-{i}", timeline, 8) for i in range(runs)]
    png = gpu_usage_figure(panels)
    assert png.startswith(PNG_MAGIC)
    height = png_pixels(png).shape[0]
    rows = runs if runs <= 3 else (runs + 1) // 2
    assert height > 200 * rows  # panels are stacked, not squeezed into one


def test_usage_figure_needs_a_panel() -> None:
    with pytest.raises(ValueError, match="at least one panel"):
        gpu_usage_figure([])


def test_reclaims_figure_is_a_png() -> None:
    png = reclaims_figure({"deepboot": [100.0, 7200.0, 9000.0], "pollux-only": []})
    assert png.startswith(PNG_MAGIC)


def test_missing_matplotlib_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the import fail like an absent package.
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert not figures.matplotlib_available()
    with pytest.raises(MissingDependencyError, match=r"deepboot\[report\]"):
        jct_cdf_figure({"a": [1.0]})


def test_simulator_and_cli_do_not_import_matplotlib() -> None:
    code = (
        "import sys, deepboot.sim.run, deepboot.cli.main, deepboot.cli.compare, "
        "deepboot.report.figures, deepboot.report.html\n"
        "sys.exit(1 if 'matplotlib' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@st.composite
def timelines(draw: st.DrawFn) -> list[Point]:
    """Sorted timelines of an 8-GPU cluster, with repeated instants."""
    steps = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 7.0, 60.0]), min_size=0, max_size=40))
    points = []
    t = draw(st.sampled_from([0.0, 100.0]))
    for step in steps:
        t += step
        used: list[int] = []
        for _ in range(5):  # training, lent, running, protect, sleep; the rest is free
            used.append(draw(st.integers(0, 8 - sum(used))))
        training, lent, running, protect, sleep = used
        points.append(Point(t, training, lent, running, protect, sleep, 8 - sum(used)))
    return points


@settings(max_examples=60, deadline=None)
@given(points=timelines(), bins=st.integers(1, 30))
def test_usage_segments_conserve_capacity_times_time(points: list[Point], bins: int) -> None:
    edges, values = usage_segments(points, max_segments=bins)
    span = points[-1].t - points[0].t if points else 0.0
    if span <= 0:
        assert values.shape[1] == 0
        return
    assert values.shape[1] <= bins
    assert edges[0] == points[0].t and edges[-1] == points[-1].t
    np.testing.assert_allclose((values.sum(axis=0) * np.diff(edges)).sum(), 8 * span)
    assert np.all(values >= -1e-9)
