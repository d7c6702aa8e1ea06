"""Interval arithmetic against known values, and the replications table."""

from __future__ import annotations

import math

import pytest

from deepboot.report.intervals import interval_rows, intervals_csv
from deepboot.report.stats import mean_interval, paired_difference

# Student's sleep data (Cushny & Peebles 1905): extra hours of sleep with two drugs
# on the same ten patients. R: t.test(x2, x1, paired = TRUE) gives mean difference
# 1.58, 95% CI [0.7001142, 2.4598858], t = 4.0621 on 9 degrees of freedom.
DRUG1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_the_paired_interval_of_students_sleep_data() -> None:
    d = paired_difference(DRUG2, DRUG1)
    assert d.n == 10
    assert d.mean == pytest.approx(1.58)
    assert d.low == pytest.approx(0.7001142, abs=1e-6)
    assert d.high == pytest.approx(2.4598858, abs=1e-6)
    assert d.excludes_zero
    assert not paired_difference(DRUG1, DRUG1).excludes_zero


def test_the_textbook_interval_of_one_to_five() -> None:
    # mean 3, sd sqrt(2.5), t(0.975, 4) = 2.776445: half-width 1.963243.
    iv = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert iv.mean == 3.0
    assert iv.half == pytest.approx(2.776445 * math.sqrt(2.5) / math.sqrt(5), rel=1e-6)
    assert iv.half == pytest.approx(1.963243, abs=1e-6)


@pytest.mark.parametrize(
    ("xs", "half"),
    [([4.2], math.inf), ([2.0, 2.0, 2.0], 0.0)],
    ids=["one-sample", "no-spread"],
)
def test_degenerate_samples(xs: list[float], half: float) -> None:
    assert mean_interval(xs).half == half


def test_bad_samples_are_errors() -> None:
    with pytest.raises(ValueError):
        mean_interval([])
    with pytest.raises(ValueError):
        mean_interval([1.0, math.nan])
    with pytest.raises(ValueError):
        paired_difference([1.0, 2.0], [1.0])


def summary(jct: float) -> dict[str, dict[str, float]]:
    return {
        "training": {"avg_jct_s": jct, "p99_jct_s": 2 * jct, "restarts": 3.0},
        "inference": {"avg_delay_s": 0.5},
    }


def test_rows_pair_each_run_with_the_baseline() -> None:
    samples = {
        ("w", "base"): [summary(x) for x in DRUG1],
        ("w", "mine"): [summary(x) for x in DRUG2],
    }
    rows = interval_rows(samples, "base")
    assert [r.run for r in rows] == ["base", "mine"]
    assert rows[0].diff is None
    mine = rows[1]
    assert mine.diff is not None and mine.diff.low == pytest.approx(0.7001142, abs=1e-6)
    assert mine.relative == pytest.approx(1.58 / (sum(DRUG1) / 10))
    text = intervals_csv(rows)
    assert text.splitlines()[0].startswith("workload,run,replications,training.avg_jct_s.mean")
    assert text.splitlines()[2].endswith(",True")
