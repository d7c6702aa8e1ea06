"""The replications table of ``deepboot compare --replications K``.

For every (workload, run): each metric's mean over the K replications with its 95%
interval, and the paired difference of the average JCT against the baseline run with
its interval (:mod:`deepboot.report.stats`); a difference is "real" only where its
interval excludes zero.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from deepboot.report.stats import Interval, mean_interval, paired_difference

METRICS: tuple[tuple[str, str], ...] = (
    ("training.avg_jct_s", "Avg JCT (s)"),
    ("training.p99_jct_s", "p99 JCT (s)"),
    ("training.restarts", "Restarts"),
    ("inference.avg_delay_s", "Inference delay (s)"),
    ("inference.slo_attainment", "SLO attained (%)"),
)
"""(summary path, header) of the metrics given intervals."""

PERCENT = frozenset({"inference.slo_attainment"})
"""Metrics that are fractions, shown in the table as percentages (the CSV keeps the
fraction)."""

DIFF_METRIC = "training.avg_jct_s"


def _value(summary: Mapping[str, Any], path: str) -> float:
    """The metric at ``path``; NaN where the run has none (no inference: no SLO)."""
    node: Any = summary
    for key in path.split("."):
        node = node[key]
    return math.nan if node is None else float(node)


@dataclass(frozen=True, slots=True)
class IntervalRow:
    """One (workload, run) over its replications.

    Attributes:
        workload: Workload name.
        run: Run name.
        metrics: Each metric's interval, by summary path.
        diff: The paired difference of the average JCT against the baseline (None
            for the baseline itself, or when the replications do not pair up).
        relative: ``diff`` as a fraction of the baseline's mean average JCT.
    """

    workload: str
    run: str
    metrics: Mapping[str, Interval]
    """Each metric's interval, by summary path; a metric some replication lacks (an
    SLO without inference) is left out."""
    diff: Interval | None = None
    relative: float | None = None


def interval_rows(
    samples: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]], baseline: str | None
) -> list[IntervalRow]:
    """Rows for every (workload, run) of ``samples``, in their order.

    Args:
        samples: The summaries of each (workload, run), in replication order (the
            same perturbed workloads for every run of a workload).
        baseline: The run the average JCT is compared with (None: no comparison).
    """
    rows = []
    for (workload, run), summaries in samples.items():
        served = all(s.get("inference", {}).get("tasks") for s in summaries)
        metrics = {}
        for path, _ in METRICS:
            if path.startswith("inference.") and not served:
                continue  # no request: no delay, no SLO to attain
            values = [_value(s, path) for s in summaries]
            if all(math.isfinite(v) for v in values):
                metrics[path] = mean_interval(values)
        base = samples.get((workload, baseline)) if baseline else None
        diff = relative = None
        if base is not None and run != baseline and len(base) == len(summaries):
            mine = [_value(s, DIFF_METRIC) for s in summaries]
            theirs = [_value(s, DIFF_METRIC) for s in base]
            diff = paired_difference(mine, theirs)
            base_mean = mean_interval(theirs).mean
            relative = diff.mean / base_mean if base_mean else None
        rows.append(IntervalRow(workload, run, metrics, diff, relative))
    return rows


def _cell(r: IntervalRow, path: str) -> str:
    iv = r.metrics.get(path)
    if iv is None:
        return "-"
    if path in PERCENT:
        return f"{100 * iv.mean:.1f} ± {100 * iv.half:.1f}"
    return _fmt(iv)


def _fmt(iv: Interval) -> str:
    if abs(iv.mean) < 100:
        return f"{iv.mean:,.2f} ± {iv.half:,.2f}"
    return f"{iv.mean:,.0f} ± {iv.half:,.0f}"


def interval_table(rows: Sequence[IntervalRow], baseline: str | None, replications: int) -> Table:
    """A rich table of :func:`interval_rows`."""
    table = Table(
        title=f"Replications: mean ± 95% interval over {replications} perturbed workloads",
        title_justify="left",
        caption="Δ: paired difference of the average JCT against "
        f"{baseline or 'no baseline'} (Student t); real = its interval excludes 0",
        caption_justify="left",
    )
    table.add_column("Workload")
    table.add_column("Run")
    for _, header in METRICS:
        table.add_column(header, justify="right")
    table.add_column("Δ avg JCT (s)", justify="right")
    table.add_column("Δ %", justify="right")
    table.add_column("real?", justify="center")
    for r in rows:
        cells = [_cell(r, path) for path, _ in METRICS]
        if r.diff is None:
            diff, pct, real = ("base" if r.run == baseline else "-"), "", ""
        else:
            diff = _fmt(r.diff)
            pct = "" if r.relative is None else f"{100 * r.relative:+.1f}%"
            real = "yes" if r.diff.excludes_zero else "no"
        table.add_row(r.workload, r.run, *cells, diff, pct, real)
    return table


def intervals_csv(rows: Sequence[IntervalRow]) -> str:
    """``intervals.csv``: one row per (workload, run); mean, low and high of each metric
    and of the paired difference."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    header = ["workload", "run", "replications"]
    for path, _ in METRICS:
        header += [f"{path}.mean", f"{path}.low", f"{path}.high"]
    header += ["diff_avg_jct_s.mean", "diff_avg_jct_s.low", "diff_avg_jct_s.high", "real"]
    writer.writerow(header)
    for r in rows:
        n = r.metrics[DIFF_METRIC].n if DIFF_METRIC in r.metrics else ""
        line: list[object] = [r.workload, r.run, n]
        for path, _ in METRICS:
            iv = r.metrics.get(path)
            line += ["", "", ""] if iv is None else [repr(iv.mean), repr(iv.low), repr(iv.high)]
        if r.diff is None:
            line += ["", "", "", ""]
        else:
            line += [repr(r.diff.mean), repr(r.diff.low), repr(r.diff.high), r.diff.excludes_zero]
        writer.writerow(line)
    return out.getvalue()
