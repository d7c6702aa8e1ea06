"""``results.csv`` of a compare matrix: one row per (workload, run), raw numbers.

Columns: ``workload``, ``run``, ``spec`` (how the run was configured), then every
summary value flattened as ``section.key`` (e.g. ``training.avg_jct_s``): the schema's
sections first in schema order (keys a section gained right after it), then any
other key in the order the summaries give it, so the columns are stable and new
summary keys appear without code changes. Values are written unrounded, in
the summary's own units (seconds, counts); a key a run lacks is left empty.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deepboot.report.schema import SUMMARY_SCHEMA
from deepboot.report.table import MatrixRow

LEADING_COLUMNS: tuple[str, ...] = ("workload", "run", "spec")


def flatten_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """``{"training": {"avg_jct_s": 1.0}}`` -> ``{"training.avg_jct_s": 1.0}``.

    One level of nesting is flattened; a deeper mapping (``inference.per_service``:
    a column per service and field would be hundreds) stays in the JSON summary
    only; another value that is still not a scalar (a list) is written as its
    ``str``. ``summary`` is never mutated.
    """
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if isinstance(value, Mapping):
            for sub, inner in value.items():
                if isinstance(inner, Mapping):
                    continue
                out[f"{key}.{sub}"] = inner if _scalar(inner) else str(inner)
        else:
            out[key] = value if _scalar(value) else str(value)
    return out


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _order(seen: Sequence[str]) -> list[str]:
    """Schema keys in schema order, each section's extra keys right after it, then
    the rest; extras keep the order in which the summaries list them."""
    keys = list(dict.fromkeys(seen))
    ordered: list[str] = []
    for top, sub in SUMMARY_SCHEMA.items():
        names = [top] if sub is None else [f"{top}.{s}" for s in sub]
        # Keys an extended section gained (e.g. cluster.reclaims) follow its schema keys.
        extra = [k for k in keys if k.startswith(f"{top}.") and k not in names]
        ordered += [k for k in names + extra if k in keys]
    placed = set(ordered)
    return ordered + [k for k in keys if k not in placed]


def results_csv(rows: Sequence[MatrixRow], specs: Mapping[str, str] | None = None) -> str:
    """The CSV text of ``rows`` (header line first).

    Args:
        rows: The runs.
        specs: Run name -> its configuration text for the ``spec`` column.
    """
    flat = [flatten_summary(r.summary) for r in rows]
    keys = _order([k for f in flat for k in f if k not in LEADING_COLUMNS])
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*LEADING_COLUMNS, *keys])
    for row, values in zip(rows, flat, strict=True):
        spec = (specs or {}).get(row.run, "")
        writer.writerow([row.workload, row.run, spec, *(_cell(values.get(k)) for k in keys)])
    return buf.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_results_csv(
    path: str | Path, rows: Sequence[MatrixRow], specs: Mapping[str, str] | None = None
) -> None:
    """Write :func:`results_csv` to ``path`` (UTF-8).

    Raises:
        OSError: the file cannot be written.
    """
    Path(path).write_text(results_csv(rows, specs), encoding="utf-8")
