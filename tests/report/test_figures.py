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
    WaitCurve,
    cdf_points,
    cumulative_counts,
    gpu_usage_figure,
    inference_waits_figure,
    jct_cdf_figure,
    jct_slo_scatter_figure,
    reclaims_figure,
    usage_segments,
    wait_tail,
)
from deepboot.sim.metrics import InferenceRecord
from deepboot.sim.slo_accounting import slo_summary

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
    with pytest.raises(MissingDependencyError, match=r"pip install .matplotlib"):
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


# ------------------------------------------------------------------ inference waits


def brute_longer(delays: list[float | None], x: float) -> float:
    """Share of requests that waited longer than ``x``; None waits forever."""
    return sum(d is None or d > x for d in delays) / len(delays)


def test_wait_tail_is_exact_with_few_distinct_waits() -> None:
    x, y = wait_tail([5.0, 0.0, 2.0, None, 0.0])
    assert x.tolist() == [0.0, 2.0, 5.0]
    # 3 of 5 waited longer than 0 s (2, 5, and the one never started), and so on;
    # the one that never started is longer than every wait.
    assert y.tolist() == pytest.approx([3 / 5, 2 / 5, 1 / 5])


@pytest.mark.parametrize("delays", [[], [None, None]], ids=["no-request", "none-started"])
def test_wait_tail_without_started_requests_is_empty(delays: list[float | None]) -> None:
    x, y = wait_tail(delays)
    assert x.size == y.size == 0


@pytest.mark.parametrize(
    ("delays", "max_points"),
    [([1.0, -0.5], 500), ([1.0, float("nan")], 500), ([1.0, float("inf")], 500), ([1.0], 1)],
    ids=["negative", "nan", "inf", "one-point"],
)
def test_wait_tail_rejects_bad_input(delays: list[float | None], max_points: int) -> None:
    with pytest.raises(ValueError):
        wait_tail(delays, max_points)


def test_wait_tail_reduction_keeps_exact_points_body_and_tail() -> None:
    rng = np.random.default_rng(7)
    started = rng.lognormal(0.0, 1.5, 50_000)
    delays: list[float | None] = [*started.tolist(), *([None] * 25)]
    n = len(delays)
    x, y = wait_tail(delays, max_points=500)
    assert 400 <= x.size <= 500
    assert np.all(np.diff(x) > 0) and np.all(np.diff(y) <= 0)
    # The shortest and the longest wait are kept; past the longest only the
    # requests that never started are left.
    assert x[0] == started.min() and x[-1] == started.max()
    assert y[-1] == pytest.approx(25 / n)
    # Every point is exact (ties aside, the brute force over the raw waits).
    ordered = np.sort(started)
    for xi, yi in zip(x[::25], y[::25], strict=True):
        exact = (ordered.size - np.searchsorted(ordered, xi, side="right") + 25) / n
        assert yi == pytest.approx(exact, abs=1e-15)
    # The body: no gap of more than 1/249 of the requests (and a rounding) between
    # two points...
    assert np.max(-np.diff(np.concatenate([[1.0], y]))) <= 1 / 249 + 2 / n
    # ...and the tail: the 2nd, 10th and 100th longest waits are points of it.
    for k in (2, 10, 100):
        assert ordered[-k] in x, k
    # Every quantile, far into the tail, has a point within 5% of its share: the
    # q-quantile read off the points is at most that far from the exact one.
    for q in (0.5, 0.9, 0.99, 0.999, 0.9995):
        share = y[np.argmax(y <= 1 - q)]
        assert (1 - q) * 0.95 <= share <= 1 - q, q


@settings(max_examples=80, deadline=None)
@given(
    delays=st.lists(
        st.one_of(st.none(), st.sampled_from([0.0, 0.5, 1.0, 3.0]), st.floats(0, 1e4)),
        max_size=300,
    ),
    max_points=st.integers(2, 40),
)
def test_wait_tail_points_are_exact_and_few(delays: list[float | None], max_points: int) -> None:
    x, y = wait_tail(delays, max_points)
    assert x.size <= max_points
    started = [d for d in delays if d is not None]
    if started:
        assert x[0] == min(started) and x[-1] == max(started)
    for xi, yi in zip(x, y, strict=True):
        assert yi == pytest.approx(brute_longer(delays, float(xi)), abs=1e-12)


def record(service: str, delay: float | None, submit: float = 0.0) -> InferenceRecord:
    start = None if delay is None else submit + delay
    return InferenceRecord("r", service, "m", submit, start, None, False, delay)


def test_wait_curve_counts_agree_with_the_slo_summary() -> None:
    rng = np.random.default_rng(1)
    records = []
    for i in range(3000):
        service = ("fast", "slow", "unlisted")[i % 3]
        delay = None if i % 97 == 0 else float(rng.choice([0.0, 0.4, 0.9, 1.5, 4.0, 40.0]))
        records.append(record(service, delay, submit=float(i)))
    slo = {"fast": 0.5, "slow": 5.0}
    curve = WaitCurve.from_records("run", records, slo, default_slo_wait_s=1.0)
    full = {**slo, "unlisted": 1.0}
    summary = slo_summary(records, full, dict.fromkeys(full, 0.99))
    assert curve.attainment == pytest.approx(summary["slo_attainment"])
    assert curve.unstarted == summary["requests_unstarted"] == 31
    assert curve.requests == 3000
    assert curve.slo_wait_s == (("fast", 0.5), ("slow", 5.0), ("unlisted", 1.0))
    x, y = wait_tail([r.delay for r in records])
    np.testing.assert_array_equal(curve.waits, x)
    np.testing.assert_array_equal(curve.longer, y)


def make_curve(label: str, scale: float, unstarted: int = 0) -> WaitCurve:
    rng = np.random.default_rng(len(label))
    records = [record("svc-a", float(d)) for d in rng.exponential(scale, 2000)]
    records += [record("svc-b", float(d)) for d in rng.exponential(scale * 3, 500)]
    records += [record("svc-b", None) for _ in range(unstarted)]
    return WaitCurve.from_records(label, records, {"svc-a": 1.0, "svc-b": 30.0}, 1.0)


def test_waits_figure_is_a_wide_png() -> None:
    png = inference_waits_figure([make_curve("deepboot", 0.5), make_curve("pollux", 2.0, 40)])
    assert png.startswith(PNG_MAGIC)
    assert png_pixels(png).shape[1] >= 1000


def test_waits_figure_draws_each_run_in_its_colour() -> None:
    one = inference_waits_figure([make_curve("a", 1.0)])
    two = inference_waits_figure([make_curve("a", 1.0), make_curve("bb", 1.0)])
    first, second = figures.line_style(0)[0], figures.line_style(1)[0]
    assert share_of_colour(one, first) > 0.001
    assert share_of_colour(one, second) < 0.0002
    assert share_of_colour(two, second) > 0.001


def test_waits_figure_of_a_run_where_no_request_started() -> None:
    never = WaitCurve.from_records("stuck", [record("s", None)] * 5, {}, 1.0)
    assert never.waits.size == 0 and never.attainment == 0.0
    assert inference_waits_figure([never]).startswith(PNG_MAGIC)


def test_waits_figure_needs_requests() -> None:
    with pytest.raises(ValueError, match="at least one curve"):
        inference_waits_figure([])
    with pytest.raises(ValueError, match="at least one request"):
        inference_waits_figure([WaitCurve.from_records("idle", [], {}, 1.0)])


@pytest.mark.parametrize("runs", [2, 12], ids=["labelled", "legend"])
def test_jct_slo_scatter_is_a_png(runs: int) -> None:
    points = {f"run-{i}": (3600.0 * (1 + i / 3), 0.8 + i / 100) for i in range(runs)}
    png = jct_slo_scatter_figure(points, target=0.99 if runs == 2 else None)
    assert png.startswith(PNG_MAGIC)
    assert png_pixels(png).shape[1] >= 900


def test_jct_slo_scatter_needs_a_point() -> None:
    with pytest.raises(ValueError, match="at least one point"):
        jct_slo_scatter_figure({})


def test_scatter_labels_of_close_points_do_not_overlap() -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6.4), layout="constrained")
    ax = fig.add_subplot()
    xs = np.array([1.00, 1.01, 1.02, 1.60, 1.62])
    ys = np.array([90.0, 90.5, 89.6, 88.0, 88.4])
    ax.scatter(xs, ys)
    ax.set_xlim(0, 2.1)
    ax.set_ylim(80, 100)
    figures._label_points(fig, ax, [f"run-{i}\n1.00 h, 90.0%" for i in range(5)], xs, ys)
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == 5
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b)
