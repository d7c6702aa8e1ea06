"""Strict reading of small numeric CSV files, with errors that name file, line and field."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deepboot.core.errors import InputError


def shorten(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters (with "..."), for error messages."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class Range:
    """The valid values of one numeric column: ``low <= v <= high``.

    Attributes:
        low: Smallest valid value.
        high: Largest valid value.
        low_open: ``low`` itself is invalid (``low < v``).
        integer: Only whole numbers are valid.
        zero: 0 is valid as well, even when below ``low`` (a "none measured" value
            next to a range of meaningful positive ones).
    """

    low: float
    high: float
    low_open: bool = False
    integer: bool = False
    zero: bool = False

    def contains(self, value: float) -> bool:
        """Whether ``value`` (finite) is in the range."""
        if self.zero and value == 0.0:
            return True
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def describe(self) -> str:
        """The range in words, e.g. ``in (0, 86400]``."""
        text = f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        return ("0 or " if self.zero else "") + "in " + text


@dataclass(frozen=True, slots=True)
class CsvTable:
    """Rows of a CSV file parsed to floats, with the 1-based file line of each row.

    Attributes:
        path: The file read.
        columns: The header, in file order.
        rows: One tuple of floats per data row, in ``columns`` order (NaN for text
            columns).
        lines: The 1-based line number of each row in ``path``.
        raw: The stripped text of each row's cells.
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

    def error(self, row: int, column: str, message: str) -> InputError:
        """An :class:`InputError` at data row ``row`` (0-based) and ``column``."""
        return InputError(self.path, self.lines[row], column, message)


def read_numeric_csv(
    path: Path,
    expected: Sequence[str],
    ranges: Mapping[str, Range] | None = None,
    text: Sequence[str] = (),
    any_order: bool = False,
) -> CsvTable:
    """Read ``path``, whose header must be exactly ``expected`` (in that order, or in
    any order with ``any_order``: the table's columns are then in ``expected``'s order
    whatever the file's; Sia's per-type profiles order their columns differently).

    Args:
        path: The CSV file.
        expected: The required header.
        ranges: Valid values of each numeric column; a column without an entry only
            needs a finite number.
        text: Columns read as text, not numbers (their entry in each row is NaN; the
            caller checks the cell's text, kept in :attr:`CsvTable.raw`).

    Returns:
        The parsed table (at least one data row).

    Raises:
        InputError: the file is missing or unreadable, empty, has another header, has
            no data row, a row has the wrong number of cells, or a cell is not a finite
            number or is outside its column's range. Line numbers are 1-based.
    """
    p = str(path)
    bounds = ranges or {}
    if not path.is_file():
        raise InputError(p, 0, "", "file not found; a profile folder needs this file")
    try:
        # utf-8-sig: spreadsheets often save a byte-order mark before the header.
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            records = [(reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(p, 0, "", f"cannot read the file: {e}") from e
    records = [(ln, row) for ln, row in records if any(c.strip() for c in row)]
    want = ",".join(expected) + (" (in any order)" if any_order else "")
    if not records:
        raise InputError(p, 1, expected[0], f"the file is empty; expected the header '{want}'")
    head_line, header = records[0]
    header = [c.strip() for c in header]
    order = list(range(len(expected)))
    if any_order and sorted(header) == sorted(expected) and len(set(header)) == len(header):
        order = [header.index(name) for name in expected]
        header = list(expected)
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
    columns = [(name, name in text, bounds.get(name)) for name in expected]
    rows: list[tuple[float, ...]] = []
    raws: list[tuple[str, ...]] = []
    lines: list[int] = []
    for line, row in records[1:]:
        if len(row) != len(expected):
            field = expected[len(row)] if len(row) < len(expected) else expected[-1]
            raise InputError(
                p, line, field, f"expected {len(expected)} values ({want}), found {len(row)}"
            )
        cells = tuple(row[j].strip() for j in order)
        values = tuple(
            math.nan if is_text else _number(p, line, name, cell, valid)
            for (name, is_text, valid), cell in zip(columns, cells, strict=True)
        )
        rows.append(values)
        raws.append(cells)
        lines.append(line)
    return CsvTable(p, tuple(expected), tuple(rows), tuple(lines), tuple(raws))


def _number(path: str, line: int, name: str, cell: str, valid: Range | None) -> float:
    """The finite number in ``cell``, checked against ``valid``."""
    if not cell:
        raise InputError(path, line, name, "is empty; expected a number")
    try:
        value = float(cell)
    except ValueError:
        raise InputError(path, line, name, f"'{shorten(cell)}' is not a number") from None
    if not math.isfinite(value):
        raise InputError(path, line, name, f"'{shorten(cell)}' is not a finite number")
    if valid is None:
        return value
    if valid.integer and value != int(value):
        raise InputError(path, line, name, f"'{shorten(cell)}' is not a whole number")
    if not valid.contains(value):
        raise InputError(path, line, name, f"'{shorten(cell)}' must be {valid.describe()}")
    return value
