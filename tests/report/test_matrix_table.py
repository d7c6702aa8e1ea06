"""The compare matrix table: cells, units, baseline change and the best values."""

from __future__ import annotations

import pytest

from deepboot.report.table import (
    COMPARE_COLUMNS,
    MATRIX_HEADERS,
    MatrixRow,
    best_cells,
    matrix_cells,
    matrix_table,
    to_text,
)

from .builders import make_rows, make_summary


def cell(cells: list[list[str]], row: int, header: str) -> str:
    return cells[row][MATRIX_HEADERS.index(header)]


def test_cells_follow_the_headers_with_one_unit_per_column() -> None:
    cells = matrix_cells(make_rows())
    assert all(len(r) == len(MATRIX_HEADERS) for r in cells)
    assert cells[0][:3] == ["small", "deepboot", "160 / 160"]
    assert cell(cells, 0, "Avg JCT (s)") == "2,366"
    assert cell(cells, 0, "Makespan (h)") == "10.00"
    assert cell(cells, 0, "Lent GPU-h") == "10.0"
    assert cell(cells, 0, "Inference avg delay (s)") == "0.75"
    assert cell(cells, 0, "Inference p99 delay (s)") == "8.00"
    assert cell(cells, 0, "SLO attained (%)") == "95.0"
    assert cell(cells, 1, "Reclaims") == "0"


@pytest.mark.parametrize(
    ("baseline", "expected"),
    [
        (None, ["base", "+88.1%", "base", "+66.7%"]),
        ("pollux-only", ["-46.8%", "base", "-40.0%", "base"]),
        ("missing", ["-", "-", "-", "-"]),
    ],
    ids=["first-run", "named", "absent"],
)
def test_baseline_change_is_per_workload(baseline: str | None, expected: list[str]) -> None:
    cells = matrix_cells(make_rows(), baseline)
    assert [r[-1] for r in cells] == expected


def test_summary_without_inference_keys_shows_dashes() -> None:
    rows = [MatrixRow("w", "old", make_summary(cold_starts=None, reclaims=None, lent_gpu_s=None))]
    cells = matrix_cells(rows)
    for header in (
        "Cold starts",
        "Inference avg delay (s)",
        "Inference p99 delay (s)",
        "SLO attained (%)",
        "Lent GPU-h",
        "Reclaims",
    ):
        assert cell(cells, 0, header) == "-"


def test_best_cells_need_two_values_and_keep_ties() -> None:
    rows = [
        MatrixRow("w", "a", make_summary(avg_jct=100.0)),
        MatrixRow("w", "b", make_summary(avg_jct=100.0)),
        MatrixRow("v", "alone", make_summary(avg_jct=5.0)),
    ]
    best = best_cells(rows)
    avg = MATRIX_HEADERS.index(COMPARE_COLUMNS[0].header)
    assert (0, avg) in best and (1, avg) in best
    assert not any(r == 2 for r, _ in best)  # nothing to compare with on workload v


def test_the_highest_slo_attainment_is_the_best() -> None:
    rows = [
        MatrixRow("w", "a", make_summary(attainment=0.9)),
        MatrixRow("w", "b", make_summary(attainment=0.99)),
    ]
    col = MATRIX_HEADERS.index("SLO attained (%)")
    assert (1, col) in best_cells(rows) and (0, col) not in best_cells(rows)


def test_rich_table_lists_every_run() -> None:
    text = to_text(matrix_table(make_rows(), title="Comparison (4 runs)"), width=220)
    assert "Comparison (4 runs)" in text
    assert text.count("deepboot") == 2 and text.count("pollux-only") == 2
    assert "-46.8%" not in text and "+88.1%" in text


def test_reference_rows_are_shown_but_never_ranked() -> None:
    rows = [
        MatrixRow("w", "deepboot", make_summary(avg_jct=2300.0)),
        MatrixRow("w", "pollux-only", make_summary(avg_jct=4200.0)),
        MatrixRow("w", "limit", make_summary(avg_jct=2000.0), reference=True),
    ]
    best = best_cells(rows)
    avg = MATRIX_HEADERS.index(COMPARE_COLUMNS[0].header)
    assert (0, avg) in best
    assert not any(r == 2 for r, _ in best)
    assert matrix_cells(rows)[2][avg] == "2,000"


@pytest.mark.parametrize("width", [80, 100, 140])
def test_a_narrow_table_fits_its_width_with_the_telling_columns(width: int) -> None:
    table = matrix_table(make_rows(), "pollux-only", title="Comparison", width=width)
    text = to_text(table, width=1000)  # rendered at its natural width: nothing squeezed
    assert max(len(line) for line in text.splitlines()) <= width, text
    assert "…" not in text
    for word in ("small", "deepboot", "JCT", "-46.8%", "SLO"):
        assert word in text, (width, word)
    wider = to_text(matrix_table(make_rows(), "pollux-only", width=width + 60), width=1000)
    assert len(wider.splitlines()[2]) >= len(text.splitlines()[2])  # more room, more columns


def test_wide_shows_every_column() -> None:
    text = to_text(matrix_table(make_rows(), "pollux-only"), width=1000)
    for header in MATRIX_HEADERS:
        for word in header.split(" "):
            assert word in text, header


def test_the_training_pool_only_run_is_the_default_baseline() -> None:
    from deepboot.report.table import training_pool_only

    runs = [("deepboot", None, False), ("limit", False, True), ("pollux-only", False, False)]
    assert training_pool_only(runs) == "pollux-only"  # the no-inference bound is not it
    assert training_pool_only(runs[:2]) is None
