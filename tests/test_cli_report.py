"""Result tables and the summary schema check."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from deepboot.report.schema import SUMMARY_SCHEMA, SummaryError, conform_summary
from deepboot.report.table import (
    METRICS,
    Unit,
    compare_table,
    format_value,
    summary_table,
    to_text,
)


def make_summary(
    policy: str = "pollux", avg_jct: float = 2446.0, **training: Any
) -> dict[str, Any]:
    """A complete summary dict; ``training`` overrides fields of its training section."""
    return {
        "policy": policy,
        "workload": "workload-6",
        "cluster": {
            "nodes": 16,
            "gpus_per_node": 4,
            "inference_nodes": 0,
            "lent_gpu_s": 0.0,
            "reclaims": 0,
            "util_training_pool": 0.8,
            "util_inference_pool": 0.0,
        },
        "training": {
            "jobs": 160,
            "completed": 160,
            "avg_jct_s": avg_jct,
            "median_jct_s": 1200.0,
            "p99_jct_s": 20000.0,
            "makespan_s": 30000.0,
            "avg_queue_s": 45.5,
            "restarts": 321,
            "restart_s": 9630.0,
            "max_job_restarts": 17,
            "max_job_restart_s": 510.0,
            **training,
        },
        "inference": {
            "tasks": 0,
            "completed": 0,
            "cold_starts": 0,
            "warm_hits": 0,
            "avg_delay_s": 0.0,
            "p99_delay_s": 0.0,
            "slo_attainment": 1.0,
            "slo_worst_window": None,
            "requests_late": 0,
            "requests_unstarted": 0,
            "requests_dropped": 0,
            "p50_delay_s": 0.0,
            "max_delay_s": 0.0,
            "reclaims_proactive": 0,
            "reclaims_reactive": 0,
            "per_service": {},
        },
        "scheduler": {"rounds": 500, "decision_ms_median": 12.5, "decision_ms_max": 2500.0},
        "wall_s": 42.0,
    }


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (45.5, Unit.SECONDS, "45.5 s"),
        (2446.0, Unit.SECONDS, "2,446 s (40.8 min)"),
        (30000.0, Unit.SECONDS, "30,000 s (8.33 h)"),
        (12.5, Unit.MILLISECONDS, "12.5 ms"),
        (2500.0, Unit.MILLISECONDS, "2.50 s"),
        (1234, Unit.COUNT, "1,234"),
        (None, Unit.SECONDS, "-"),
        (float("nan"), Unit.COUNT, "-"),
        (True, Unit.COUNT, "-"),
    ],
    ids=["short-s", "minutes", "hours", "ms", "ms-as-s", "count", "none", "nan", "bool"],
)
def test_format_value(value: Any, unit: Unit, text: str) -> None:
    assert format_value(value, unit) == text


def test_every_unit_formats_a_number() -> None:
    for unit in Unit:
        assert format_value(1.0, unit) != "-"


def test_summary_table_shows_every_metric() -> None:
    text = to_text(summary_table(make_summary()), width=120)
    assert "pollux on workload-6 (16x4)" in text
    assert "160 / 160" in text
    for metric in METRICS:
        assert metric.label in text
    assert "2,446 s (40.8 min)" in text
    assert "12.5 ms" in text


def test_summary_table_tolerates_missing_values() -> None:
    summary = make_summary(avg_jct_s=float("nan"))
    del summary["scheduler"]
    text = to_text(summary_table(summary), width=120)
    assert "Average JCT" in text and "-" in text


def test_compare_table_shows_ratios_to_baseline() -> None:
    a = make_summary("pollux", 2000.0)
    b = make_summary("tiresias", 3000.0)
    text = to_text(compare_table([a, b]), width=160)
    assert "pollux / workload-6" in text and "tiresias / workload-6" in text
    assert "(1.50x)" in text
    text = to_text(compare_table([a, b], baseline=1), width=160)
    assert "(0.67x)" in text


@pytest.mark.parametrize("baseline", [-1, 2], ids=["negative", "past-end"])
def test_compare_table_rejects_bad_baseline(baseline: int) -> None:
    with pytest.raises(ValueError, match="baseline"):
        compare_table([make_summary(), make_summary()], baseline=baseline)
    with pytest.raises(ValueError, match="at least one"):
        compare_table([])


def test_conform_summary_keeps_exactly_the_schema() -> None:
    summary = make_summary()
    summary["extra"] = 1
    summary["training"]["extra"] = 2
    before = copy.deepcopy(summary)
    out = conform_summary(summary)
    assert summary == before
    assert list(out) == list(SUMMARY_SCHEMA)
    for key, sub in SUMMARY_SCHEMA.items():
        if sub is not None:
            assert list(out[key]) == list(sub)


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda s: s.pop("wall_s"), "'wall_s'"),
        (lambda s: s["training"].pop("p99_jct_s"), "p99_jct_s"),
        (lambda s: s.update(cluster="16x4"), "not a mapping"),
    ],
    ids=["top-level", "nested", "not-a-mapping"],
)
def test_conform_summary_rejects_incomplete(mutate: Any, words: str) -> None:
    summary = make_summary()
    mutate(summary)
    with pytest.raises(SummaryError, match=words):
        conform_summary(summary)
