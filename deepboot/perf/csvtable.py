"""Strict reading of small numeric CSV files, with errors that name file, line and field."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deepboot.core.errors import InputError


@dataclass(frozen=True, slots=True)
class CsvTable:
    """Rows of a CSV file parsed to floats, with the 1-based file line of each row.

    Attributes:
        path: The file read.
        columns: The header, in file order.
        rows: One tuple of floats per data row, in ``columns`` order.
        lines: The 1-based line number of each row in ``path``.
        raw: The text of each row's cells (for columns that are codes, not numbers).
    """

    path: str
    columns: tuple[str, ...]
    rows: tuple[tuple[float, ...], ...]
    lines: tuple[int, ...]
    raw: tuple[tuple[str, ...], ...]

    def column(self, name: str) -> list[float]:
        """All values of column ``name``."""
        i = self.columns.index(name)
        return [r[i] for r in self.rows]


def read_numeric_csv(
    path: Path,
    expected: Sequence[str],
    integer: Sequence[str] = (),
    positive: Sequence[str] = (),
    non_negative: Sequence[str] = (),
) -> CsvTable:
    """Read ``path``, whose header must be exactly ``expected`` (in that order).

    Args:
        path: The CSV file.
        expected: The required header.
        integer: Columns whose values must be whole numbers.
        positive: Columns whose values must be > 0.
        non_negative: Columns whose values must be >= 0.

    Returns:
        The parsed table (at least one data row).

    Raises:
        InputError: the file is missing or unreadable, empty, has another header, has
            no data row, a row has the wrong number of cells, or a cell is not a finite
            number or breaks its column's constraint. Line numbers are 1-based.
    """
    p = str(path)
    if not path.is_file():
        raise InputError(p, 0, "", "file not found; a profile folder needs this file")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            records = [(reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(p, 0, "", f"cannot read the file: {e}") from e
    records = [(ln, row) for ln, row in records if any(c.strip() for c in row)]
    want = ",".join(expected)
    if not records:
        raise InputError(p, 1, expected[0], f"the file is empty; expected the header '{want}'")
    head_line, header = records[0]
    header = [c.strip() for c in header]
    for i, name in enumerate(expected):
        got = header[i] if i < len(header) else ""
        if got != name:
            raise InputError(
                p,
                head_line,
                got or name,
                f"bad header: expected '{want}', got '{','.join(header)}'",
            )
    if len(header) != len(expected):
        raise InputError(p, head_line, header[len(expected)], f"bad header: expected '{want}' only")
    if len(records) == 1:
        raise InputError(p, head_line, expected[0], "the file has a header but no data rows")
    rows: list[tuple[float, ...]] = []
    raws: list[tuple[str, ...]] = []
    lines: list[int] = []
    for line, row in records[1:]:
        if len(row) != len(expected):
            field = expected[len(row)] if len(row) < len(expected) else expected[-1]
            raise InputError(
                p, line, field, f"expected {len(expected)} values ({want}), found {len(row)}"
            )
        values: list[float] = []
        for name, cell in zip(expected, row, strict=True):
            text = cell.strip()
            try:
                value = float(text)
            except ValueError:
                raise InputError(p, line, name, f"'{text}' is not a number") from None
            if not math.isfinite(value):
                raise InputError(p, line, name, f"'{text}' is not a finite number")
            if name in integer and value != int(value):
                raise InputError(p, line, name, f"'{text}' is not a whole number")
            if name in positive and value <= 0:
                raise InputError(p, line, name, f"'{text}' must be > 0")
            if name in non_negative and value < 0:
                raise InputError(p, line, name, f"'{text}' must be >= 0")
            values.append(value)
        rows.append(tuple(values))
        raws.append(tuple(c.strip() for c in row))
        lines.append(line)
    return CsvTable(p, tuple(expected), tuple(rows), tuple(lines), tuple(raws))
