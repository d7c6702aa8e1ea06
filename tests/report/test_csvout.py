"""results.csv: one row per run, every summary value, stable columns."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from deepboot.report.csvout import flatten_summary, results_csv, write_results_csv
from deepboot.report.table import MatrixRow

from .builders import make_rows, make_summary


def read(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_flatten_summary_is_one_level_and_pure() -> None:
    summary = make_summary()
    before = repr(summary)
    flat = flatten_summary(summary)
    assert flat["training.avg_jct_s"] == 2366.0
    assert flat["inference.cold_starts"] == 12
    assert flat["policy"] == "deepboot"
    assert repr(summary) == before


def test_per_service_detail_stays_out_of_the_csv() -> None:
    summary = make_summary()
    summary["inference"]["per_service"] = {"a": {"slo_attainment": 0.5}}
    flat = flatten_summary(summary)
    assert flat["inference.slo_attainment"] == 0.95
    assert not any("per_service" in k for k in flat)


def test_columns_are_schema_ordered_with_extensions_after_their_section() -> None:
    header = results_csv(make_rows()).splitlines()[0].split(",")
    # The summary's own "workload" key is the leading column, not repeated.
    assert header[:4] == ["workload", "run", "spec", "policy"]
    assert header.count("workload") == 1
    assert header.index("cluster.inference_nodes") < header.index("cluster.lent_gpu_s")
    assert header.index("cluster.reclaims") < header.index("training.jobs")
    # The inference section is part of the schema, between training and scheduler.
    assert (
        header.index("training.restart_s")
        < header.index("inference.cold_starts")
        < header.index("scheduler.rounds")
        < header.index("wall_s")
    )


def test_values_round_trip_unrounded(tmp_path: Path) -> None:
    rows = [
        MatrixRow("small", "a", make_summary(avg_jct=2366.123456789)),
        MatrixRow("small", "b", make_summary(cold_starts=None)),
    ]
    path = tmp_path / "results.csv"
    write_results_csv(path, rows, {"a": "a=deepboot"})
    got = read(path.read_text(encoding="utf-8"))
    assert [r["run"] for r in got] == ["a", "b"]
    assert got[0]["spec"] == "a=deepboot" and got[1]["spec"] == ""
    assert float(got[0]["training.avg_jct_s"]) == 2366.123456789
    assert got[1]["inference.cold_starts"] == ""  # b has no inference section
