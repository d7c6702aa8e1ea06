"""PNG figures of simulation results (matplotlib, Agg), built from plain data.

Every function takes plain sequences or small dataclasses (never the engine) and
returns the PNG bytes, so the caller decides where they go (a file, a base64 ``<img>``).

matplotlib is a dependency of the base install, but it is imported only when a figure
is drawn, so the simulator and the CLI start without loading it; an environment that
lacks it anyway raises :class:`MissingDependencyError`, which says how to fix it.

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

INSTALL_HINT = "pip install 'matplotlib>=3.8'"


class MissingDependencyError(DeepbootError):
    """The package figures need (matplotlib) is not installed in this environment."""


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


# ------------------------------------------------------------- inference waits


class RequestLike(Protocol):
    """One inference request (``deepboot.sim.metrics.InferenceRecord``)."""

    @property
    def service(self) -> str: ...
    @property
    def delay(self) -> float | None: ...


def wait_tail(
    delays: Sequence[float | None], max_points: int = 500
) -> tuple[FloatArray, FloatArray]:
    """The complementary CDF of request waits, as at most ``max_points`` exact points.

    A wait of None (a request that never started) counts as waiting forever: it is
    longer than every finite wait.

    Args:
        delays: Each request's wait before it started serving, seconds (None: never
            started).
        max_points: Most points returned (>= 2).

    Returns:
        ``(x, y)``: ``x`` distinct waits in ascending order, ``y[i]`` the fraction of
        all requests (unstarted ones included) that waited strictly longer than
        ``x[i]``. With at most ``max_points`` distinct waits every one is kept;
        otherwise the smallest and largest wait and waits at ranks spaced evenly both
        in rank and in the log of the number of waits at or above them, so the tail
        keeps its resolution down to the single longest wait. Each ``y`` is exact.
        No started request gives two empty arrays.

    Raises:
        ValueError: ``max_points`` < 2, or a wait is negative or not finite.
    """
    if max_points < 2:
        raise ValueError(f"max_points must be >= 2; got {max_points}")
    started = np.sort(np.asarray([d for d in delays if d is not None], dtype=np.float64))
    if started.size and not (np.all(np.isfinite(started)) and started[0] >= 0):
        raise ValueError("request waits must be finite and >= 0 (None: never started)")
    m = started.size
    unstarted = len(delays) - m
    x = np.unique(started)
    if x.size > max_points:
        half = max_points // 2
        by_rank = np.linspace(0.0, m - 1.0, max_points - half)
        by_tail = m - np.geomspace(1.0, float(m), half)  # k waits at or above the rank
        ranks = np.clip(np.rint(np.concatenate([by_rank, by_tail])), 0, m - 1).astype(np.intp)
        x = np.unique(started[ranks])
    longer = m - np.searchsorted(started, x, side="right") + unstarted
    return x, longer.astype(np.float64) / max(len(delays), 1)


@dataclass(frozen=True, slots=True)
class WaitCurve:
    """One run's inference request waits for :func:`inference_waits_figure`, reduced.

    Attributes:
        label: The run name.
        requests: Requests that arrived.
        unstarted: Requests that never started serving (they wait forever).
        met: Requests that started within their service's SLO.
        waits: Distinct waits in seconds, ascending (see :func:`wait_tail`).
        longer: Fraction of all requests that waited longer than each of ``waits``.
        slo_wait_s: ``(service, SLO seconds)`` of every service that had a request,
            in order of first arrival.
    """

    label: str
    requests: int
    unstarted: int
    met: int
    waits: FloatArray
    longer: FloatArray
    slo_wait_s: tuple[tuple[str, float], ...] = ()

    @property
    def attainment(self) -> float:
        """Share of requests that met their SLO (1.0 with no request), as the summary's
        ``inference.slo_attainment``."""
        return self.met / self.requests if self.requests else 1.0

    @classmethod
    def from_records(
        cls,
        label: str,
        records: Sequence[RequestLike],
        slo_wait_s: Mapping[str, float],
        default_slo_wait_s: float,
        max_points: int = 500,
    ) -> WaitCurve:
        """A curve from raw request records (see :func:`wait_tail`).

        Args:
            label: The run name.
            records: Every request, in arrival order.
            slo_wait_s: Service -> SLO seconds (``SimResult.slo_wait_s``).
            default_slo_wait_s: The SLO of a service missing from ``slo_wait_s``.
            max_points: Most points kept.
        """
        slos: dict[str, float] = {}
        met = 0
        delays: list[float | None] = []
        for r in records:
            slo = slos.setdefault(r.service, slo_wait_s.get(r.service, default_slo_wait_s))
            met += r.delay is not None and r.delay <= slo
            delays.append(r.delay)
        waits, longer = wait_tail(delays, max_points)
        unstarted = sum(d is None for d in delays)
        return cls(label, len(delays), unstarted, met, waits, longer, tuple(slos.items()))


_SLO_STYLES = ("--", ":", "-.", (0, (5, 1.5, 1, 1.5, 1, 1.5)), (0, (12, 3)))


def _seconds_text(s: float) -> str:
    if s >= 3600:
        return f"{s / HOUR:g} h"
    if s >= 120:
        return f"{s / 60:g} min"
    return f"{s:g} s"


def _slo_groups(curves: Sequence[WaitCurve]) -> list[tuple[float, list[str]]]:
    """Distinct SLOs ascending, each with its services (first-seen order)."""
    groups: dict[float, list[str]] = {}
    for curve in curves:
        for service, slo in curve.slo_wait_s:
            names = groups.setdefault(slo, [])
            if service not in names:
                names.append(service)
    return sorted(groups.items())


def inference_waits_figure(
    curves: Sequence[WaitCurve], title: str = "Inference request waits against the SLO"
) -> bytes:
    """The fraction of requests that waited longer than x, one line per run, and each
    distinct service SLO as a vertical line.

    The x axis (wait, seconds) is linear up to 1 s and logarithmic beyond; the y axis
    (percent of requests) is logarithmic, so the tail that misses the SLO stays
    readable. Requests that never started hold their share up to the right edge.

    Args:
        curves: One per run (legend order); every one with at least one request.
        title: Figure title.

    Raises:
        MissingDependencyError: matplotlib is missing.
        ValueError: no curve, or a curve without requests.
    """
    if not curves:
        raise ValueError("inference_waits_figure needs at least one curve")
    if any(c.requests == 0 for c in curves):
        raise ValueError("every curve needs at least one request")
    groups = _slo_groups(curves)
    longest = max([*(float(c.waits[-1]) for c in curves if c.waits.size), 1.0])
    right = max([longest, *(slo for slo, _ in groups)]) * 2.0
    # The lowest share drawn; a curve's last drop (to 0) runs off the bottom.
    positive = [float(c.longer[c.longer > 0].min()) for c in curves if np.any(c.longer > 0)]
    smallest = min(positive or [1.0 / max(c.requests for c in curves)])
    with _styled() as figure_cls:
        fig = figure_cls(figsize=(12, 6.4), layout="constrained")
        ax = fig.add_subplot()
        for i, curve in enumerate(curves):
            color, style = line_style(i)
            # Below the shortest wait every request waited longer: the curve starts at 1.
            xs = np.concatenate([[0.0], curve.waits, [right]])
            ys = np.concatenate(
                [[1.0], curve.longer, curve.longer[-1:] if curve.waits.size else [1.0]]
            )
            text = f"{curve.label}: {curve.attainment:.1%} within SLO, {curve.requests:,} requests"
            if curve.unstarted:
                text += f", {curve.unstarted:,} never started"
            ax.step(xs, ys, where="post", color=color, linestyle=style, linewidth=2, label=text)
        for j, (slo, services) in enumerate(groups):
            named = ", ".join(services) if len(services) <= 3 else f"{len(services)} services"
            ax.axvline(
                slo,
                color="#333333",
                linestyle=_SLO_STYLES[j % len(_SLO_STYLES)],
                linewidth=1.6,
                label=f"SLO {_seconds_text(slo)} ({named})",
            )
        ax.set_xscale("symlog", linthresh=1.0, linscale=0.6)
        ax.set_xlim(0, right)
        _wait_ticks(ax, right)
        ax.set_yscale("log")
        bottom = max(smallest / 2.5, 1e-7)
        ax.set_ylim(bottom, 1.15)
        _percent_ticks(ax, bottom)
        ax.set_xlabel("wait before serving starts (seconds; linear to 1 s, log scale beyond)")
        ax.set_ylabel("requests that waited longer (log scale)")
        ax.set_title(title)
        fig.legend(loc="outside lower center", ncols=1 if len(curves) + len(groups) <= 4 else 2)
        return _png(fig)


def _percent_ticks(ax: Axes, bottom: float) -> None:
    """Percent ticks on a log-share y axis: 1, 2 and 5 of each decade over up to three
    and a half decades, 1 alone beyond (100%, 10%, 1% ...)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    subs = (1.0, 2.0, 5.0) if math.log10(1.0 / bottom) <= 3.5 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v * 100:.4g}%"))


def _wait_ticks(ax: Axes, right: float) -> None:
    """Readable wait ticks on a symlog axis (0, 0.5, 1, 2, 5, 10, 30, 60 ... seconds)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ticks = [0.0, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200]
    ticks += [86400.0 * d for d in (1, 2, 7, 30)]
    ax.xaxis.set_major_locator(FixedLocator([t for t in ticks if t <= right]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: "0" if v == 0 else _seconds_text(v)))


def jct_slo_scatter_figure(
    points: Mapping[str, tuple[float, float]],
    target: float | None = None,
    title: str = "Training JCT against inference SLO attainment",
) -> bytes:
    """One labelled point per run: average training JCT (hours) against the share of
    inference requests that met their SLO. Up and to the left is better.

    Labels are placed beside their points where they overlap no other label or point;
    from nine runs on a legend beside the axes names them instead.

    Args:
        points: Run label -> (average JCT in seconds, SLO attainment in [0, 1]).
        target: The SLO target every service shares, drawn as a horizontal line
            (None: none drawn).
        title: Figure title.

    Raises:
        MissingDependencyError: matplotlib is missing.
        ValueError: ``points`` is empty.
    """
    if not points:
        raise ValueError("jct_slo_scatter_figure needs at least one point")
    xs = np.asarray([jct for jct, _ in points.values()], dtype=np.float64) / HOUR
    ys = np.asarray([att for _, att in points.values()], dtype=np.float64) * 100
    beside = len(points) > 8
    with _styled() as figure_cls:
        fig = figure_cls(figsize=(14, 6.4) if beside else (11, 6.4), layout="constrained")
        ax = fig.add_subplot()
        markers = ("o", "s", "D", "^", "v", "P", "X", "*")
        for i, (label, x, y) in enumerate(zip(points, xs, ys, strict=True)):
            color, _ = line_style(i)
            ax.scatter(
                [x],
                [y],
                s=110,
                color=color,
                marker=markers[(i // len(_PALETTE)) % len(markers)],
                edgecolors="black",
                linewidths=0.8,
                zorder=3,
                label=label,
            )
        notes: list[Any] = []  # fixed texts the point labels must not cover
        low = float(ys.min())
        if target is not None:
            ax.axhline(target * 100, color="#333333", linestyle="--", linewidth=1.4)
            notes.append(
                ax.annotate(
                    f"SLO target {target * 100:g}%",
                    (0.0, target * 100),
                    xycoords=("axes fraction", "data"),
                    xytext=(6, 4),
                    textcoords="offset points",
                    fontsize=11,
                    color="#333333",
                )
            )
            low = min(low, target * 100)
        span = max(100.0 - low, 1.0)
        ax.set_ylim(max(low - 0.25 * span, 0.0), 100.0 + 0.12 * span)
        # From 0 so that horizontal distances compare JCTs honestly; room for labels.
        right = float(xs.max())
        ax.set_xlim(0, right * 1.3 if right > 0 else 1.0)
        ax.set_xlabel("average training JCT (hours)")
        ax.set_ylabel("inference requests within SLO (%)")
        ax.set_title(title)
        notes.append(
            ax.text(
                0.99,
                0.02,
                "better: up and to the left",
                transform=ax.transAxes,
                ha="right",
                va="bottom",
                color="#555555",
                fontsize=11,
            )
        )
        if beside:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=True)
        else:
            texts = [
                f"{label}\n{x:.2f} h, {y:.1f}%" for label, x, y in zip(points, xs, ys, strict=True)
            ]
            _label_points(fig, ax, texts, xs, ys, notes)
        return _png(fig)


_LABEL_SPOTS = (
    (9, 5, "left", "bottom"),
    (9, -5, "left", "top"),
    (-9, 5, "right", "bottom"),
    (-9, -5, "right", "top"),
    (0, 11, "center", "bottom"),
    (0, -11, "center", "top"),
    (9, 30, "left", "bottom"),
    (9, -30, "left", "top"),
    (-9, 30, "right", "bottom"),
    (-9, -30, "right", "top"),
)
"""Offsets (points) and alignments tried in turn for a point's label."""


def _label_points(
    fig: Figure,
    ax: Axes,
    texts: Sequence[str],
    xs: FloatArray,
    ys: FloatArray,
    notes: Sequence[Any] = (),
) -> None:
    """Label each point at the first of :data:`_LABEL_SPOTS` where its text stays
    inside the axes and overlaps no other label, point or one of ``notes`` (texts
    already drawn); at the first spot when none is free.

    The layout is computed once, then frozen, so the positions checked are the ones
    drawn.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.transforms import Bbox

    canvas = FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]
    inside = ax.get_window_extent(renderer)
    centres = ax.transData.transform(np.column_stack([xs, ys]))
    pad = 9.0  # pixels around a marker
    taken = [Bbox.from_extents(cx - pad, cy - pad, cx + pad, cy + pad) for cx, cy in centres]
    taken += [n.get_window_extent(renderer) for n in notes]

    def put(i: int, spot: tuple[int, int, str, str]) -> Any:
        dx, dy, ha, va = spot
        return ax.annotate(
            texts[i],
            (float(xs[i]), float(ys[i])),
            xytext=(dx, dy),
            textcoords="offset points",
            ha=ha,
            va=va,
            fontsize=11,
        )

    # Highest points first: their labels get the spots above them.
    for i in sorted(range(len(texts)), key=lambda k: -float(ys[k])):
        own = taken[i]
        for spot in _LABEL_SPOTS:
            label = put(i, spot)
            box = label.get_window_extent(renderer)
            within = inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1)
            if within and not any(box.overlaps(b) for b in taken if b is not own):
                break
            label.remove()
        else:
            label = put(i, _LABEL_SPOTS[0])
            box = label.get_window_extent(renderer)
        taken.append(box)
