"""PNG figures of simulation results (matplotlib, Agg), built from plain data.

Every function takes plain sequences or small dataclasses (never the engine) and
returns the PNG bytes, so the caller decides where they go (a file, a base64 ``<img>``).

matplotlib is an optional dependency (``pip install 'deepboot[report]'``). It is
imported only when a figure is drawn, so the simulator works without it; a missing
install raises :class:`MissingDependencyError`, which says how to fix it.

Figures are built on :class:`matplotlib.figure.Figure` objects directly, never
through ``pyplot``: no global figure registry, no GUI backend, nothing left open.
Styling is passed per call inside :func:`matplotlib.rc_context`, which restores the
global rc settings on exit.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from deepboot.core.errors import DeepbootError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FloatArray = npt.NDArray[np.float64]

HOUR = 3600.0

INSTALL_HINT = "pip install 'deepboot[report]'"


class MissingDependencyError(DeepbootError):
    """An optional package needed for figures (matplotlib) is not installed."""


class TimelineLike(Protocol):
    """One point of a GPU-use timeline (``deepboot.sim.metrics.TimelinePoint``).

    The counts hold from ``t`` until the next point's ``t``.
    """

    @property
    def t(self) -> float: ...
    @property
    def training(self) -> int: ...
    @property
    def lent(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def protect(self) -> int: ...
    @property
    def sleep(self) -> int: ...
    @property
    def free(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Layer:
    """One band of the GPU-use stack.

    Attributes:
        field: The timeline attribute it reads.
        label: Legend text.
        color: Fill colour.
    """

    field: str
    label: str
    color: str


USAGE_LAYERS: tuple[Layer, ...] = (
    Layer("training", "training (training pool)", "#1f5fa8"),
    Layer("lent", "training on lent inference GPUs", "#6fb3e8"),
    Layer("running", "inference RUNNING", "#d9452b"),
    Layer("protect", "inference PROTECT (warm, kept)", "#f2a93b"),
    Layer("sleep", "inference SLEEP (warm, lendable)", "#9b7fc7"),
    Layer("free", "free", "#e6e6e6"),
)
"""Bands of the stacked GPU-use plot, bottom to top."""

# Colour-blind-safe palette (Okabe-Ito, then extra distinct tones) with line styles
# cycled on top, so a dozen runs stay distinguishable in print too.
_PALETTE = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#000000",
    "#8C564B",
    "#7F7F7F",
    "#BCBD22",
)
_LINESTYLES = ("-", "--", "-.", ":")

_RC: Mapping[str, Any] = {
    "font.size": 12,
    "axes.titlesize": 14,
    "axes.labelsize": 12,
    "xtick.labelsize": 11,
    "ytick.labelsize": 11,
    "legend.fontsize": 11,
    "figure.titlesize": 15,
    "axes.grid": True,
    "grid.alpha": 0.35,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_DPI = 100


def _matplotlib_figure_class() -> type[Figure]:
    """The ``Figure`` class, imported on first use.

    Raises:
        MissingDependencyError: matplotlib is not installed.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependencyError(
            f"figures need matplotlib, which is not installed ({exc}); run: {INSTALL_HINT}"
        ) from None
    return Figure


def matplotlib_available() -> bool:
    """Whether figures can be drawn (matplotlib imports)."""
    try:
        _matplotlib_figure_class()
    except MissingDependencyError:
        return False
    return True


@contextmanager
def _styled() -> Iterator[type[Figure]]:
    figure_cls = _matplotlib_figure_class()
    import matplotlib

    rc: Any = dict(_RC)  # matplotlib types rc keys as a Literal union
    with matplotlib.rc_context(rc):
        yield figure_cls


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # A Figure made without pyplot gets an Agg canvas on savefig; no GUI involved.
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight", facecolor="white")
    return buf.getvalue()


def line_style(i: int) -> tuple[str, str]:
    """(colour, line style) of the ``i``-th series; distinct for the first 40."""
    return _PALETTE[i % len(_PALETTE)], _LINESTYLES[(i // len(_PALETTE)) % len(_LINESTYLES)]


# --------------------------------------------------------------------------- data


def cdf_points(values: Sequence[float]) -> tuple[FloatArray, FloatArray]:
    """The empirical CDF of ``values`` as step points.

    Returns:
        ``(x, y)``, both of shape (n,): ``x`` the sorted finite values, ``y[i] =
        (i + 1) / n`` the fraction of values <= ``x[i]``. Empty input gives two empty
        arrays. Non-finite values are dropped.
    """
    arr = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    arr.sort()
    n = arr.size
    return arr, np.arange(1, n + 1, dtype=np.float64) / max(n, 1)


def usage_segments(
    points: Sequence[TimelineLike], max_segments: int = 1500
) -> tuple[FloatArray, FloatArray]:
    """Piecewise-constant GPU counts of a timeline, per :data:`USAGE_LAYERS` band.

    Point ``i`` holds from ``points[i].t`` to ``points[i + 1].t``; the last point
    closes the timeline. Points at the same time overwrite each other (the later
    one wins, as after several events at one instant). When the timeline has more
    than ``max_segments`` segments it is resampled on a regular grid of
    ``max_segments`` bins, each holding the time-weighted mean count over the bin,
    so busy timelines stay exact in GPU-seconds and cheap to draw.

    Args:
        points: Timeline points sorted by ``t``.
        max_segments: Most segments returned (>= 1).

    Returns:
        ``(edges, values)``: ``edges`` of shape (S + 1,) in seconds, ``values`` of shape
        (len(USAGE_LAYERS), S). S is 0 when the timeline spans no time.

    Raises:
        ValueError: the points are not sorted by time, or ``max_segments`` < 1.
    """
    if max_segments < 1:
        raise ValueError(f"max_segments must be >= 1; got {max_segments}")
    t = np.asarray([p.t for p in points], dtype=np.float64)
    counts = np.asarray(
        [[float(getattr(p, layer.field)) for p in points] for layer in USAGE_LAYERS],
        dtype=np.float64,
    ).reshape(len(USAGE_LAYERS), len(points))
    if t.size and np.any(np.diff(t) < 0):
        raise ValueError("timeline points must be sorted by time")
    if t.size < 2 or t[-1] <= t[0]:
        return np.asarray([], dtype=np.float64), np.zeros((len(USAGE_LAYERS), 0))
    widths = np.diff(t)
    keep = widths > 0  # zero-width segments carry no GPU-seconds
    edges = np.concatenate([t[:-1][keep], t[-1:]])
    values = counts[:, :-1][:, keep]
    if values.shape[1] <= max_segments:
        return edges, values
    # Exact bin means from the cumulative integral, which is piecewise linear.
    integral = np.concatenate(
        [np.zeros((values.shape[0], 1)), np.cumsum(values * np.diff(edges), axis=1)], axis=1
    )
    grid = np.linspace(edges[0], edges[-1], max_segments + 1)
    at_grid = np.vstack([np.interp(grid, edges, row) for row in integral])
    return grid, np.diff(at_grid, axis=1) / np.diff(grid)


def cumulative_counts(times: Sequence[float]) -> tuple[FloatArray, FloatArray]:
    """Step points of how many events happened by each time.

    Returns:
        ``(x, y)`` of shape (n + 1,): ``x`` starts at 0 then the sorted times;
        ``y`` is 0 then 1..n.
    """
    x = np.concatenate([[0.0], np.sort(np.asarray(times, dtype=np.float64))])
    return x, np.arange(x.size, dtype=np.float64)


# ------------------------------------------------------------------------ figures


def _hours_axis(ax: Axes) -> None:
    ax.set_xlabel("simulated time (hours)")
    ax.set_xlim(left=0)


def jct_cdf_figure(jcts: Mapping[str, Sequence[float]], title: str = "JCT CDF") -> bytes:
    """One CDF line of training JCTs per run, JCT in hours on a log axis.

    Args:
        jcts: Run label -> completed jobs' JCTs in seconds (legend order = mapping
            order). A run with no completed job is listed with "(none completed)".
        title: Figure title.

    Returns:
        The PNG bytes.

    Raises:
        MissingDependencyError: matplotlib is missing.
    """
    with _styled() as figure_cls:
        # Many runs: the legend goes beside the axes, where it hides no curve.
        beside = len(jcts) > 8
        fig = figure_cls(figsize=(15, 6) if beside else (12, 6), layout="constrained")
        ax = fig.add_subplot()
        lowest = math.inf
        for i, (label, values) in enumerate(jcts.items()):
            x, y = cdf_points(values)
            color, style = line_style(i)
            if x.size == 0:
                ax.plot([], [], color=color, linestyle=style, label=f"{label} (none completed)")
                continue
            hours = np.maximum(x / HOUR, 1e-3)
            lowest = min(lowest, float(hours[0]))
            # Start each curve at 0 so steps read as "fraction done by this JCT".
            ax.step(
                np.concatenate([[hours[0]], hours]),
                np.concatenate([[0.0], y]),
                where="post",
                color=color,
                linestyle=style,
                linewidth=2,
                # Seconds, as in the result table, so the two read side by side.
                label=f"{label} (avg {float(np.mean(x)):,.0f} s)",
            )
        ax.set_xscale("log")
        _log_hours_ticks(ax, lowest)
        ax.set_xlabel("job completion time (hours, log scale)")
        ax.set_ylabel("fraction of training jobs")
        ax.set_ylim(0, 1.02)
        ax.set_title(title)
        if beside:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=True)
        else:
            ax.legend(loc="lower right", frameon=True)
        return _png(fig)


def _log_hours_ticks(ax: Axes, lowest: float) -> None:
    """Readable tick labels on a log-hours axis (0.1, 0.5, 1, 2, 5, 10 ... not 10^x)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ticks = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500]
    if math.isfinite(lowest):
        ticks = [x for x in ticks if x >= lowest / 2.5] or ticks
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))


@dataclass(frozen=True, slots=True)
class UsagePanel:
    """One run's GPU use for :func:`gpu_usage_figure`, already reduced to segments.

    Attributes:
        label: Panel title (the run name).
        edges: Segment boundaries in seconds, shape (S + 1,).
        values: GPUs per :data:`USAGE_LAYERS` band and segment, shape
            (len(USAGE_LAYERS), S).
        training_pool_gpus: GPUs of the training pool, drawn as a dashed reference
            line (0: none drawn).
    """

    label: str
    edges: FloatArray
    values: FloatArray
    training_pool_gpus: int = 0

    @classmethod
    def from_timeline(
        cls,
        label: str,
        timeline: Sequence[TimelineLike],
        training_pool_gpus: int = 0,
        max_segments: int = 1500,
    ) -> UsagePanel:
        """A panel from raw timeline points (see :func:`usage_segments`).

        Raises:
            ValueError: the timeline is not sorted by time.
        """
        edges, values = usage_segments(timeline, max_segments)
        return cls(label, edges, values, training_pool_gpus)


def gpu_usage_figure(panels: Sequence[UsagePanel], title: str = "GPUs over time") -> bytes:
    """GPUs over time stacked by use (:data:`USAGE_LAYERS`), one panel per run.

    Panels share both axes (hours, GPUs) and one legend at the bottom; two columns of
    panels from four runs on.

    Raises:
        MissingDependencyError: matplotlib is missing.
        ValueError: ``panels`` is empty.
    """
    if not panels:
        raise ValueError("gpu_usage_figure needs at least one panel")
    ncols = 1 if len(panels) <= 3 else 2
    nrows = math.ceil(len(panels) / ncols)
    with _styled() as figure_cls:
        fig = figure_cls(
            figsize=(6.2 * ncols if ncols > 1 else 12, 2.9 * nrows + 1.3), layout="constrained"
        )
        axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
        top = 1.0
        for panel, ax in zip(panels, axes.flat, strict=False):
            _stack(ax, panel.edges, panel.values)
            if panel.values.size:
                top = max(top, float(panel.values.sum(axis=0).max()))
            if panel.training_pool_gpus:
                ax.axhline(panel.training_pool_gpus, color="black", linestyle="--", linewidth=1.2)
            ax.set_title(panel.label, loc="left")
        for ax in axes.flat[len(panels) :]:
            ax.set_visible(False)
        for ax in axes[:, 0]:
            ax.set_ylabel("GPUs")
        # The lowest visible panel of each column carries the time axis (the last row
        # may be short by one panel).
        for col in range(ncols):
            row = max(r for r in range(nrows) if r * ncols + col < len(panels) or r == 0)
            axes[row, col].set_xlabel("simulated time (hours)")
            axes[row, col].tick_params(labelbottom=True)
        # Shared axes: one explicit range fits the longest run in every panel.
        end_h = max((float(p.edges[-1]) / HOUR for p in panels if p.edges.size), default=1.0)
        axes[0, 0].set_xlim(0, end_h * 1.01)
        axes[0, 0].set_ylim(0, top * 1.04)
        handles = [_patch(layer) for layer in USAGE_LAYERS]
        labels = [layer.label for layer in USAGE_LAYERS]
        if any(p.training_pool_gpus for p in panels):
            from matplotlib.lines import Line2D

            handles.append(Line2D([], [], color="black", linestyle="--"))
            labels.append("training-pool size")
        fig.suptitle(title)
        fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)))
        return _png(fig)


def _patch(layer: Layer) -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor=layer.color, edgecolor="none", label=layer.label)


def _stack(ax: Axes, edges: FloatArray, values: FloatArray) -> None:
    if values.shape[1] == 0:
        ax.text(0.5, 0.75, "no timeline", ha="center", va="center", transform=ax.transAxes)
        return
    hours = edges / HOUR
    bottom = np.zeros(values.shape[1])
    for layer, row in zip(USAGE_LAYERS, values, strict=True):
        if np.any(row > 0):
            ax.stairs(bottom + row, hours, baseline=bottom, fill=True, color=layer.color)
        bottom = bottom + row


def reclaims_figure(
    reclaims: Mapping[str, Sequence[float]],
    title: str = "Reclaims over time",
    end_s: float = 0.0,
) -> bytes:
    """Cumulative count of lent GPUs reclaimed for inference, one line per run.

    Args:
        reclaims: Run label -> the times (s) of its reclaims.
        title: Figure title.
        end_s: Draw every line up to this time (e.g. the end of the longest run);
            the last reclaim when smaller.

    Raises:
        MissingDependencyError: matplotlib is missing.
    """
    with _styled() as figure_cls:
        fig = figure_cls(figsize=(12, 5.5))
        ax = fig.add_subplot()
        end = max([end_s, *(max(v) for v in reclaims.values() if len(v))])
        for i, (label, times) in enumerate(reclaims.items()):
            x, y = cumulative_counts(times)
            color, style = line_style(i)
            hours = np.concatenate([x, [end]]) / HOUR
            ax.step(
                hours,
                np.concatenate([y, y[-1:]]),
                where="post",
                color=color,
                linestyle=style,
                linewidth=2,
                label=f"{label} ({len(times):,})",
            )
        _hours_axis(ax)
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("GPUs reclaimed (cumulative)")
        ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.legend(loc="upper left", frameon=True)
        return _png(fig)
