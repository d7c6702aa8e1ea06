"""Rich result tables built from run summaries (see :mod:`deepboot.report.schema`)."""

from __future__ import annotations

import enum
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


class Unit(enum.Enum):
    """How a metric's value is displayed."""

    SECONDS = "seconds"
    MILLISECONDS = "milliseconds"
    COUNT = "count"


@dataclass(frozen=True, slots=True)
class Metric:
    """One row of a result table.

    Attributes:
        label: Row label.
        section: Top-level summary key ("training", "scheduler"; "" for top level).
        key: Key inside the section.
        unit: Display unit.
        ratio: Whether a comparison shows the ratio to the baseline (lower is better).
    """

    label: str
    section: str
    key: str
    unit: Unit
    ratio: bool = False

    def value(self, summary: Mapping[str, Any]) -> Any:
        holder: Any = summary.get(self.section, {}) if self.section else summary
        return holder.get(self.key) if isinstance(holder, Mapping) else None


METRICS: tuple[Metric, ...] = (
    Metric("Average JCT", "training", "avg_jct_s", Unit.SECONDS, ratio=True),
    Metric("Median JCT", "training", "median_jct_s", Unit.SECONDS, ratio=True),
    Metric("p99 JCT", "training", "p99_jct_s", Unit.SECONDS, ratio=True),
    Metric("Makespan", "training", "makespan_s", Unit.SECONDS, ratio=True),
    Metric("Average queueing", "training", "avg_queue_s", Unit.SECONDS, ratio=True),
    Metric("Restarts", "training", "restarts", Unit.COUNT, ratio=True),
    Metric("Restart time", "training", "restart_s", Unit.SECONDS, ratio=True),
    Metric("Scheduler rounds", "scheduler", "rounds", Unit.COUNT),
    Metric("Decision latency (median)", "scheduler", "decision_ms_median", Unit.MILLISECONDS),
    Metric("Decision latency (max)", "scheduler", "decision_ms_max", Unit.MILLISECONDS),
    Metric("Wall time", "", "wall_s", Unit.SECONDS),
)
"""The rows of every result table, in display order."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    x = float(value)
    return x if math.isfinite(x) else None


def format_value(value: Any, unit: Unit) -> str:
    """Human-readable value; ``-`` for a missing or non-finite one."""
    x = _number(value)
    if x is None:
        return "-"
    if unit is Unit.COUNT:
        return f"{x:,.0f}"
    if unit is Unit.MILLISECONDS:
        return f"{x:.1f} ms" if x < 1000 else f"{x / 1000:.2f} s"
    if abs(x) < 120:
        return f"{x:.1f} s"
    if abs(x) < 7200:
        return f"{x:,.0f} s ({x / 60:.1f} min)"
    return f"{x:,.0f} s ({x / 3600:.2f} h)"


def _completed(summary: Mapping[str, Any]) -> str:
    training = summary.get("training", {})
    done = _number(training.get("completed"))
    total = _number(training.get("jobs"))
    if done is None or total is None:
        return "-"
    return f"{done:.0f} / {total:.0f}"


def _cluster(summary: Mapping[str, Any]) -> str:
    c = summary.get("cluster", {})
    text = f"{c.get('nodes', '?')}x{c.get('gpus_per_node', '?')}"
    inference = c.get("inference_nodes") or 0
    return text + (f", {inference} inference nodes" if inference else "")


def _label(summary: Mapping[str, Any]) -> str:
    return f"{summary.get('policy', '?')} / {summary.get('workload', '?')}"


def summary_table(summary: Mapping[str, Any]) -> Table:
    """A two-column table (metric, value) of one run summary; never mutates it.

    Missing or non-finite values show as ``-`` (e.g. no job completed).
    """
    table = Table(
        title=Text(
            f"{summary.get('policy', '?')} on {summary.get('workload', '?')} ({_cluster(summary)})"
        ),
        title_justify="left",
    )
    table.add_column("Metric")
    table.add_column("Value", justify="right")
    table.add_row("Training jobs completed", _completed(summary))
    for m in METRICS:
        table.add_row(m.label, format_value(m.value(summary), m.unit))
    return table


def compare_table(summaries: Sequence[Mapping[str, Any]], baseline: int = 0) -> Table:
    """Several run summaries side by side, one column each.

    For lower-is-better metrics every non-baseline cell also shows its ratio to the
    ``baseline`` column (e.g. ``0.62x``).

    Raises:
        ValueError: ``summaries`` is empty or ``baseline`` is out of range.
    """
    if not summaries:
        raise ValueError("compare_table needs at least one summary")
    if not 0 <= baseline < len(summaries):
        raise ValueError(f"baseline {baseline} out of range for {len(summaries)} summaries")
    table = Table(title=Text(f"Comparison (ratios vs. {_label(summaries[baseline])})"))
    table.add_column("Metric")
    for s in summaries:
        table.add_column(Text(_label(s)), justify="right")
    table.add_row("Cluster", *(Text(_cluster(s)) for s in summaries))
    table.add_row("Training jobs completed", *(_completed(s) for s in summaries))
    for m in METRICS:
        base = _number(m.value(summaries[baseline]))
        cells = []
        for i, s in enumerate(summaries):
            value = m.value(s)
            cell = format_value(value, m.unit)
            x = _number(value)
            if m.ratio and i != baseline and x is not None and base:
                cell += f" ({x / base:.2f}x)"
            cells.append(cell)
        table.add_row(m.label, *cells)
    return table


def to_text(table: Table, width: int = 100) -> str:
    """Render a table as plain text (no colour), e.g. for logs and tests."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False).print(table)
    return buf.getvalue()
