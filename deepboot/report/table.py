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
    Metric("Most restarts of one job", "training", "max_job_restarts", Unit.COUNT, ratio=True),
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
    text = c.get("shape") or f"{c.get('nodes', '?')}x{c.get('gpus_per_node', '?')}"
    inference = c.get("inference_nodes") or 0
    return text + (f", {inference} inference nodes" if inference else "")


def _label(summary: Mapping[str, Any]) -> str:
    return f"{summary.get('policy', '?')} / {summary.get('workload', '?')}"


def summary_table(summary: Mapping[str, Any], label: str | None = None) -> Table:
    """A two-column table (metric, value) of one run summary; never mutates it.

    Missing or non-finite values show as ``-`` (e.g. no job completed). ``label``
    names the run in the title (default: its policy).
    """
    what = summary.get("policy", "?") if label is None else label
    table = Table(
        title=Text(f"{what} on {summary.get('workload', '?')} ({_cluster(summary)})"),
        title_justify="left",
    )
    table.add_column("Metric")
    table.add_column("Value", justify="right")
    table.add_row("Training jobs completed", _completed(summary))
    for m in METRICS:
        table.add_row(m.label, format_value(m.value(summary), m.unit))
    return table


def _percent(value: Any) -> str:
    x = _number(value)
    return "-" if x is None else f"{100.0 * x:.1f}%"


def _slo_waits(inference: Mapping[str, Any]) -> str:
    """The wait(s) attainment was measured against: ``1 s``, or ``1-3 s`` when the
    services differ."""
    per = inference.get("per_service")
    waits = sorted(
        {
            w
            for s in (per.values() if isinstance(per, Mapping) else ())
            if isinstance(s, Mapping) and (w := _number(s.get("slo_wait_s"))) is not None
        }
    )
    if not waits:
        return "?"
    if len(waits) == 1:
        return f"{waits[0]:g} s"
    return f"{waits[0]:g}-{waits[-1]:g} s"


def inference_table(summary: Mapping[str, Any]) -> Table | None:
    """What the run did to inference, in a two-column table; None when the run served
    no inference (no task, or no inference pool). Never mutates ``summary``.

    Rows: requests, SLO attainment with the wait it was measured against, the
    median, p99 and longest waits, cold and host-memory starts, reclaims (proactive
    and reactive) and the GPU-hours lent to training."""
    inference = summary.get("inference")
    cluster = summary.get("cluster", {})
    if not isinstance(inference, Mapping) or not _number(inference.get("tasks")):
        return None
    if not _number(cluster.get("inference_nodes")):
        return None
    table = Table(title=Text("Inference"), title_justify="left")
    table.add_column("Metric")
    table.add_column("Value", justify="right")
    late = _number(inference.get("requests_late"))
    table.add_row("Requests", format_value(inference.get("tasks"), Unit.COUNT))
    table.add_row(
        f"Within the SLO (wait <= {_slo_waits(inference)})",
        _percent(inference.get("slo_attainment")),
    )
    table.add_row("Late requests", "-" if late is None else f"{late:,.0f}")
    table.add_row("Median wait", format_value(inference.get("p50_delay_s"), Unit.SECONDS))
    table.add_row("p99 wait", format_value(inference.get("p99_delay_s"), Unit.SECONDS))
    table.add_row("Longest wait", format_value(inference.get("max_delay_s"), Unit.SECONDS))
    table.add_row("Cold starts", format_value(inference.get("cold_starts"), Unit.COUNT))
    if "host_starts" in inference:
        table.add_row(
            "Starts from host memory", format_value(inference.get("host_starts"), Unit.COUNT)
        )
    table.add_row(
        "Reclaims (proactive / reactive)",
        f"{format_value(inference.get('reclaims_proactive'), Unit.COUNT)} / "
        f"{format_value(inference.get('reclaims_reactive'), Unit.COUNT)}",
    )
    lent = _number(cluster.get("lent_gpu_s"))
    table.add_row("GPU-hours lent to training", "-" if lent is None else f"{lent / 3600:,.1f}")
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


# ------------------------------------------------------------------ compare matrix


@dataclass(frozen=True, slots=True)
class Column:
    """One numeric column of the compare matrix (one unit for the whole column).

    Attributes:
        header: Column header, unit included.
        section: Top-level summary key ("training", "inference", "cluster").
        key: Key inside the section.
        divisor: The summary value is divided by this for display (3600: s -> h).
        decimals: Decimals shown.
        only_if: A key of the same section that must be a non-zero number for the
            value to mean anything ("" = always shown).
        lower_is_better: Whether the lowest value is the best one; False for
            descriptive columns (lent GPU-hours, reclaims), never highlighted.
        higher_is_better: The highest value is the best one (SLO attainment);
            overrides ``lower_is_better``.
    """

    header: str
    section: str
    key: str
    divisor: float = 1.0
    decimals: int = 0
    only_if: str = ""
    lower_is_better: bool = True
    higher_is_better: bool = False

    def value(self, summary: Mapping[str, Any]) -> float | None:
        """The raw summary value, or None when missing, not a finite number, or
        meaningless because the section's ``only_if`` count is 0 (no inference task,
        no inference pool)."""
        holder = summary.get(self.section)
        if not isinstance(holder, Mapping):
            return None
        if self.only_if and not _number(holder.get(self.only_if)):
            return None
        return _number(holder.get(self.key))

    def text(self, summary: Mapping[str, Any]) -> str:
        """The display text: ``-`` for a missing value (e.g. a pre-inference summary)."""
        x = self.value(summary)
        if x is None:
            return "-"
        return f"{x / self.divisor:,.{self.decimals}f}"


COMPARE_COLUMNS: tuple[Column, ...] = (
    Column("Avg JCT (s)", "training", "avg_jct_s"),
    Column("Median JCT (s)", "training", "median_jct_s"),
    Column("p99 JCT (s)", "training", "p99_jct_s"),
    Column("Makespan (h)", "training", "makespan_s", divisor=3600.0, decimals=2),
    Column("Restarts", "training", "restarts"),
    Column("Max restarts/job", "training", "max_job_restarts"),
    Column("Cold starts", "inference", "cold_starts", only_if="tasks"),
    Column("Inference avg delay (s)", "inference", "avg_delay_s", decimals=2, only_if="tasks"),
    Column("Inference p99 delay (s)", "inference", "p99_delay_s", decimals=2, only_if="tasks"),
    # Requests started within their service's slo_wait_s (deepboot.sim.slo_accounting).
    Column(
        "SLO attained (%)",
        "inference",
        "slo_attainment",
        divisor=0.01,
        decimals=1,
        only_if="tasks",
        higher_is_better=True,
    ),
    # Lending more is the point, but reclaims are its price: neither is "best" alone.
    Column(
        "Lent GPU-h",
        "cluster",
        "lent_gpu_s",
        divisor=3600.0,
        decimals=1,
        only_if="inference_nodes",
        lower_is_better=False,
    ),
    Column("Reclaims", "cluster", "reclaims", only_if="inference_nodes", lower_is_better=False),
)
"""The numeric columns of the compare matrix, in display order."""


@dataclass(frozen=True, slots=True)
class MatrixRow:
    """One run of the compare matrix.

    Attributes:
        workload: Workload name.
        run: Run name.
        summary: Its run summary (never mutated).
        reference: A bound to compare against rather than a contender (e.g. training
            on every GPU with no inference): shown, but never ranked best.
    """

    workload: str
    run: str
    summary: Mapping[str, Any]
    reference: bool = False


MATRIX_HEADERS: tuple[str, ...] = (
    "Workload",
    "Run",
    "Done",
    *(c.header for c in COMPARE_COLUMNS),
    "Avg JCT vs base",
)
"""Every header of the compare matrix, in order (text and HTML share it)."""


def _avg_jct(summary: Mapping[str, Any]) -> float | None:
    return COMPARE_COLUMNS[0].value(summary)


def baseline_change(row: MatrixRow, base: MatrixRow | None) -> str:
    """Average JCT of ``row`` relative to ``base``, e.g. ``-38.2%``; ``base`` for itself."""
    if base is None:
        return "-"
    if base is row:
        return "base"
    x, b = _avg_jct(row.summary), _avg_jct(base.summary)
    if x is None or not b:
        return "-"
    return f"{(x / b - 1.0) * 100.0:+.1f}%"


def matrix_cells(rows: Sequence[MatrixRow], baseline: str | None = None) -> list[list[str]]:
    """The compare matrix as text cells, one list per row in :data:`MATRIX_HEADERS` order.

    Args:
        rows: Runs, grouped by workload in display order.
        baseline: Run name each workload's average JCT is compared with; None: the
            first run of each workload. A workload without that run shows ``-``.
    """
    bases: dict[str, MatrixRow] = {}
    for r in rows:
        if r.workload not in bases and (baseline is None or r.run == baseline):
            bases[r.workload] = r
    return [
        [
            r.workload,
            r.run,
            _completed(r.summary),
            *(c.text(r.summary) for c in COMPARE_COLUMNS),
            baseline_change(r, bases.get(r.workload)),
        ]
        for r in rows
    ]


def best_cells(rows: Sequence[MatrixRow]) -> set[tuple[int, int]]:
    """``(row, column)`` indices into :func:`matrix_cells` of each workload's best value.

    Best = lowest, per workload and per lower-is-better :data:`COMPARE_COLUMNS`
    column (highest for a higher-is-better one), among the non-reference rows that
    have the value; ties are all best.
    Used to highlight cells.
    """
    best: set[tuple[int, int]] = set()
    offset = MATRIX_HEADERS.index(COMPARE_COLUMNS[0].header)
    for workload in dict.fromkeys(r.workload for r in rows):
        members = [i for i, r in enumerate(rows) if r.workload == workload and not r.reference]
        for j, col in enumerate(COMPARE_COLUMNS):
            if not (col.lower_is_better or col.higher_is_better):
                continue
            values = {i: col.value(rows[i].summary) for i in members}
            present = [v for v in values.values() if v is not None]
            if len(present) < 2:
                continue
            top = max(present) if col.higher_is_better else min(present)
            best.update((i, offset + j) for i, v in values.items() if v == top)
    return best


def _two_lines(text: str) -> str:
    """``text`` broken at the space that makes its longest line shortest."""
    words = text.split(" ")
    if len(words) < 2:
        return text
    cut = min(
        range(1, len(words)),
        key=lambda k: max(len(" ".join(words[:k])), len(" ".join(words[k:]))),
    )
    return " ".join(words[:cut]) + "\n" + " ".join(words[cut:])


NARROW_PRIORITY: tuple[str, ...] = (
    "Workload",
    "Run",
    "Avg JCT (s)",
    "Avg JCT vs base",
    "SLO attained (%)",
    "Done",
    "Reclaims",
    "p99 JCT (s)",
    "Makespan (h)",
    "Max restarts/job",
    "Lent GPU-h",
    "Inference p99 delay (s)",
    "Cold starts",
    "Median JCT (s)",
    "Restarts",
    "Inference avg delay (s)",
)
"""The compare matrix's columns in the order a narrow terminal keeps them: the first
that fit are shown, in :data:`MATRIX_HEADERS` order (every header appears once)."""


def matrix_table(
    rows: Sequence[MatrixRow],
    baseline: str | None = None,
    title: str = "Comparison",
    width: int | None = None,
) -> Table:
    """One rich table of every (workload, run): the compare command's output.

    Each workload's best value of a column is bold and reference rows are italic;
    the "vs base" column is the average JCT relative to ``baseline`` (see
    :func:`matrix_cells`). With ``width``, only the columns of :data:`NARROW_PRIORITY`'s
    longest prefix whose table fits ``width`` characters are shown (at least workload,
    run and average JCT); None: every column.
    """
    cells = matrix_cells(rows, baseline)
    best = best_cells(rows)
    shown = list(range(len(MATRIX_HEADERS)))
    if width is not None:
        keep = 3
        for n in range(3, len(NARROW_PRIORITY) + 1):
            if _natural_width(_build(rows, cells, best, title, _columns(n))) <= width:
                keep = n
        shown = _columns(keep)
    return _build(rows, cells, best, title, shown)


def _columns(n: int) -> list[int]:
    """Indices into :data:`MATRIX_HEADERS` of the first ``n`` priority columns, in
    display order."""
    return sorted(MATRIX_HEADERS.index(h) for h in NARROW_PRIORITY[:n])


def _natural_width(table: Table) -> int:
    console = Console(file=io.StringIO(), width=1000, color_system=None)
    return console.measure(table).maximum


def _build(
    rows: Sequence[MatrixRow],
    cells: Sequence[Sequence[str]],
    best: set[tuple[int, int]],
    title: str,
    shown: Sequence[int],
) -> Table:
    table = Table(title=Text(title), title_justify="left")
    for j in shown:
        # Headers on two lines keep the table narrow; values never wrap.
        table.add_column(
            _two_lines(MATRIX_HEADERS[j]), justify="left" if j < 2 else "right", no_wrap=True
        )
    previous = None
    for i, row in enumerate(cells):
        if previous is not None and rows[i].workload != previous:
            table.add_section()
        previous = rows[i].workload
        table.add_row(
            *(Text(row[j], style="bold" if (i, j) in best else "") for j in shown),
            style="italic" if rows[i].reference else "",
        )
    return table


def training_pool_only(runs: Sequence[tuple[str, bool | None, bool]]) -> str | None:
    """The first run that keeps training on its own pool (``(name, lending,
    no_inference)``: lending off, inference kept): the baseline a comparison of
    lending reads against. None when no run is one."""
    return next((name for name, lending, no_inf in runs if lending is False and not no_inf), None)
