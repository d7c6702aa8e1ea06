"""The picture of a runtime run's timeline (``deepboot timeline``), one PNG.

Panels on one time axis (seconds since the controller started), top to bottom:

* one per GPU pool: its GPUs stacked by state (:data:`~deepboot.report.timeline.GPU_STATES`;
  on the inference pool a job's GPU is a lent one);
* the training jobs' worker counts (step lines; a triangle where a lent GPU of the
  job was reclaimed: red for a waiting request, green ahead of demand, ``--slo``);
* with a requests CSV: each request's wait (or latency) against the SLO line.

Every reclaim is also a dotted vertical line through all panels, so its cause
(a request spike) and effects (a job shrinking, a replica starting) line up.

Drawn with the conventions of :mod:`deepboot.report.figures` (Agg, no pyplot, rc
settings per call); matplotlib missing raises
:class:`~deepboot.report.figures.MissingDependencyError`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from deepboot.report.figures import _matplotlib_figure_class, _png, _styled, line_style
from deepboot.report.timeline import (
    DOWN,
    GPU_STATES,
    IDLE,
    INFERENCE_POOL,
    JOB,
    REPLICA,
    TRAINING_POOL,
    PoolSeries,
    Requests,
    Timeline,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_COLORS = {JOB: "#1f5fa8", REPLICA: "#d9452b", IDLE: "#e6e6e6", DOWN: "#555555"}
_LENT_COLOR = "#6fb3e8"  # as figures.USAGE_LAYERS: training on lent inference GPUs
_RECLAIM_COLOR = "#b2182b"
_AHEAD_COLOR = "#1b7837"  # a proactive reclaim (--slo): taken back ahead of demand


def require_matplotlib() -> None:
    """Check that matplotlib imports (before any slow reading).

    Raises:
        MissingDependencyError: it does not; the message says how to install it.
    """
    _matplotlib_figure_class()


def _state_label(pool: str, state: str) -> str:
    if state == JOB:
        return "lent to training jobs" if pool == INFERENCE_POOL else "used by training jobs"
    if state == REPLICA:
        return "inference replicas (serving or warm)"
    return {IDLE: "idle", DOWN: "down (node left)"}[state]


def _job_offsets(n: int) -> list[float]:
    """Small vertical offsets that keep jobs at equal worker counts apart (at most
    +-0.15 worker, so a line still reads as its integer)."""
    if n <= 1:
        return [0.0] * n
    step = min(0.3 / (n - 1), 0.08)
    return [(i - (n - 1) / 2) * step for i in range(n)]


def timeline_figure(
    timeline: Timeline,
    requests: Requests | None = None,
    slo_wait_s: float = 1.0,
    title: str = "Runtime timeline",
    since: float | None = None,
) -> bytes:
    """Draw ``timeline`` (and ``requests``, when given) as one PNG.

    Args:
        timeline: The run (:func:`~deepboot.report.timeline.build_timeline`).
        requests: Requests on the timeline's clock, or None for no request panel.
        slo_wait_s: The SLO line of the request panel (s, > 0).
        title: Figure title.
        since: Where the time axis starts (seconds on the timeline's clock; None:
            0). The dashboard draws the last hour this way.

    Returns:
        The PNG bytes.

    Raises:
        MissingDependencyError: matplotlib is missing.
        ValueError: ``slo_wait_s`` is not a positive number.
    """
    if not (math.isfinite(slo_wait_s) and slo_wait_s > 0):
        raise ValueError(f"slo_wait_s must be a positive number of seconds; got {slo_wait_s}")
    end = max(timeline.end, max(requests.send, default=0.0) if requests else 0.0, 1.0)
    reclaims = sorted(t for j in timeline.jobs for t in j.reclaims)
    ahead = {t for j in timeline.jobs for t in j.ahead}
    heights = [2.2] * len(timeline.pools) + [2.6] + ([2.8] if requests is not None else [])
    with _styled() as figure_cls:
        fig = figure_cls(figsize=(13, sum(heights) + 1.0), layout="constrained")
        axes = fig.subplots(len(heights), 1, sharex=True, height_ratios=heights, squeeze=False)
        flat = list(axes[:, 0])
        for ax, series in zip(flat, timeline.pools, strict=False):
            _pool_panel(ax, series, end)
        _jobs_panel(flat[len(timeline.pools)], timeline, end)
        if requests is not None:
            _requests_panel(flat[-1], requests, slo_wait_s)
        for ax in flat:
            for t in reclaims:
                color = _AHEAD_COLOR if t in ahead else _RECLAIM_COLOR
                ax.axvline(t, color=color, linestyle=":", linewidth=1.0, alpha=0.7)
        start = 0.0 if since is None else min(max(since, 0.0), end)
        flat[-1].set_xlim(start, end + (end - start) * 0.01)
        flat[-1].set_xlabel("seconds since the controller started")
        fig.suptitle(title)
        if timeline.notes:
            fig.text(0.01, 0.0, "note: " + "; ".join(timeline.notes), fontsize=9, va="bottom")
        return _png(fig)


def _legend(ax: Axes, handles: list[Any] | None = None) -> None:
    # Outside the plot, right: the step lines and stacks use the whole width.
    kwargs: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.005, 1.0)}
    if handles is not None:
        kwargs["handles"] = handles
    ax.legend(frameon=False, borderaxespad=0.0, **kwargs)


def _pool_panel(ax: Axes, series: PoolSeries, end: float) -> None:
    from matplotlib.ticker import MaxNLocator

    edges = np.asarray([*series.times, end], dtype=np.float64)
    bottom = np.zeros(len(series.times))
    for state in GPU_STATES:
        row = np.asarray(series.counts[state], dtype=np.float64)
        if state != IDLE and not row.any():
            continue  # a state that never happens gets no legend entry
        color = _LENT_COLOR if (state == JOB and series.pool == INFERENCE_POOL) else _COLORS[state]
        ax.stairs(
            bottom + row,
            edges,
            baseline=bottom,
            fill=True,
            color=color,
            label=_state_label(series.pool, state),
        )
        bottom = bottom + row
    name = {TRAINING_POOL: "Training pool", INFERENCE_POOL: "Inference pool"}.get(
        series.pool, f"Pool {series.pool}"
    )
    ax.set_title(f"{name}: {series.gpus} GPUs", loc="left")
    ax.set_ylabel("GPUs")
    ax.set_ylim(0, max(series.gpus, 1) * 1.05)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _legend(ax)


def _jobs_panel(ax: Axes, timeline: Timeline, end: float) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    ax.set_title("Training jobs: workers", loc="left")
    ax.set_ylabel("workers")
    if not timeline.jobs:
        ax.text(0.5, 0.5, "no training job", ha="center", va="center", transform=ax.transAxes)
        return
    top = 1
    starts_shown = False
    for i, (job, dy) in enumerate(
        zip(timeline.jobs, _job_offsets(len(timeline.jobs)), strict=True)
    ):
        color, style = line_style(i)
        # An ended job's line stops at its end; a live one runs to the end of the log.
        last = job.times[-1] if job.ended else end
        x = np.asarray([*job.times, last], dtype=np.float64)
        y = np.asarray([*job.workers, job.workers[-1]], dtype=np.float64) + dy
        label = f"{job.name} ({job.ended})" if job.ended not in ("", "finished") else job.name
        ax.step(x, y, where="post", color=color, linestyle=style, linewidth=2, label=label)
        starting = job.starting()
        if any(starting):
            # GPUs it holds whose workers are still starting (or joining): a light
            # band above the formed workers, so a job is not read as idle meanwhile.
            up = y + np.asarray([*starting, starting[-1]], dtype=np.float64)
            ax.fill_between(x, y, up, step="post", color=color, alpha=0.2, linewidth=0)
            starts_shown = True
        top = max(top, *job.workers, *(job.held or (0,)))
        if job.reclaims:
            # The worker count just before the reclaim: the marker sits on the line
            # the reclaim cut short.
            early = set(job.ahead)
            for times, color in (
                ([t for t in job.reclaims if t not in early], _RECLAIM_COLOR),
                ([t for t in job.reclaims if t in early], _AHEAD_COLOR),
            ):
                before = [job.at(t - 1e-9) + dy for t in times]
                ax.plot(times, before, "v", color=color, markersize=9, zorder=5)
    ax.set_ylim(-0.3, top + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    handles, _ = ax.get_legend_handles_labels()
    kinds = (
        (any(set(j.reclaims) - set(j.ahead) for j in timeline.jobs), _RECLAIM_COLOR,
         "lent GPU reclaimed (for a waiting request)"),
        (any(j.ahead for j in timeline.jobs), _AHEAD_COLOR,
         "lent GPU reclaimed ahead of demand (--slo)"),
    )  # fmt: skip
    for present, color, label in kinds:
        if present:
            handles.append(
                Line2D([], [], color=color, marker="v", linestyle=":", markersize=9, label=label)
            )
    if starts_shown:
        from matplotlib.patches import Patch

        handles.append(
            Patch(color="grey", alpha=0.3, label="starting: GPUs held, workers not yet formed")
        )
    _legend(ax, handles)


def _requests_panel(ax: Axes, requests: Requests, slo_wait_s: float) -> None:
    what = "wait" if requests.metric == "wait_s" else "latency"
    send = np.asarray(requests.send, dtype=np.float64)
    value = np.asarray(requests.value, dtype=np.float64)
    ok = np.asarray(requests.ok, dtype=bool)
    known = ~np.isnan(value)
    good = ok & known
    n = len(requests.send)
    met = int(np.count_nonzero(good & (value <= slo_wait_s)))
    ax.set_title(
        f"Requests: {what} (s); {met:,} of {n:,} answered 200 within {slo_wait_s:g} s"
        f" (send times shifted by {requests.offset:+.1f} s)",
        loc="left",
    )
    ax.set_ylabel(f"{what} (s)")
    ax.plot(
        send[good], value[good], ".", color="#0072B2", markersize=4, alpha=0.6,
        label=f"answered 200 ({int(np.count_nonzero(good)):,})",
    )  # fmt: skip
    top = max(float(value[known].max()) if known.any() else 0.0, slo_wait_s) * 1.08
    bad = ~good
    if bad.any():
        # Unknown values (no answer) sit on the panel's top edge: seen, not scaled.
        y = np.where(known, value, top)
        ax.plot(
            send[bad], y[bad], "x", color="#D55E00", markersize=5,
            label=f"not 200, or {what} unknown ({int(np.count_nonzero(bad)):,})",
        )  # fmt: skip
    ax.axhline(
        slo_wait_s, color="black", linestyle="--", linewidth=1.2, label=f"SLO {slo_wait_s:g} s"
    )
    # Waits span 0 (a free replica) to tens of seconds (cold starts, timeouts):
    # linear below a tenth of the SLO, logarithmic above, so both ends stay readable.
    ax.set_yscale("symlog", linthresh=slo_wait_s / 10, linscale=0.5)
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylim(0, top * 1.3)
    _legend(ax)
