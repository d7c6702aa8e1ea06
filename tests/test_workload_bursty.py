"""``deepboot workload bursty`` (issue 45): streams of a chosen burstiness, checked by
the dispersion of the one-second counts of what it writes."""

from __future__ import annotations

import csv
import math
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from deepboot.core.errors import ConfigError
from deepboot.sim.traces.bursty import BurstyConfig, bursty_stream
from tests.cli_helpers import assert_one_line_error, run_cli


def _counts(path: Path, seconds: int) -> np.ndarray:
    with path.open(newline="") as f:
        times = [float(row["time"]) for row in csv.DictReader(f)]
    return np.bincount(np.floor(times).astype(np.int64), minlength=seconds)[:seconds]


@pytest.mark.parametrize("dispersion", [1.0, 3.0, 10.0, 30.0])
def test_the_written_stream_has_the_dispersion_asked_for(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, dispersion: float
) -> None:
    out = tmp_path / "b.csv"
    code, text, err = run_cli(
        capsys, "workload", "bursty", "--mean-rps", "2.6", "--dispersion", str(dispersion),
        "--duration-s", "4", "--model-gb", "28", "--cold-start", "60", "--hours", "8",
        "--seed", "1", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    counts = _counts(out, 8 * 3600)
    mean = counts.mean()
    measured = counts.var() / mean
    # Over 28,800 seconds: the mean within 5 sd of a batch process's count, the
    # dispersion within 15% (its sampling spread at D = 30 is ~4%).
    sd = math.sqrt(dispersion * 2.6 * 8 * 3600) / (8 * 3600)
    assert abs(mean - 2.6) < 5 * sd, mean
    assert abs(measured - dispersion) < 0.15 * dispersion, measured
    # The command's own line says what it wrote (times rounded to the millisecond in
    # the CSV may move an arrival across a second's edge: a hair of difference).
    said = re.search(r"dispersion ([0-9.]+) \(asked", " ".join(text.split()))
    assert said and abs(float(said.group(1)) - measured) < 0.01 * dispersion, text
    [service] = tomllib.loads((tmp_path / "b.toml").read_text())["service"]
    assert (service["model_gb"], service["cold_start_s"]) == (28, 60)
    assert service.get("slo_wait_s", 1.0) == 1.0  # the default is left out of the file


def test_a_rate_shape_is_followed_and_scaled_to_the_mean(tmp_path: Path) -> None:
    # A lull, then a peak four times the lull: the mean is the one asked for, and
    # the peak's share of the requests is its share of the shape's integral.
    shape = [(0.0, 3600.0, 1.0), (3600.0, 7200.0, 4.0)]
    config = BurstyConfig(mean_rps=5.0, dispersion=3.0)
    stream = bursty_stream(config, np.random.default_rng(0), shape)
    times = np.array([r.time for r in stream.requests])
    assert abs(len(times) / 7200 - 5.0) < 0.2
    assert abs((times >= 3600).mean() - 0.8) < 0.02
    assert list(times) == sorted(times)


def test_the_same_seed_gives_the_same_stream() -> None:
    config = BurstyConfig(mean_rps=1.0, dispersion=5.0, hours=0.5)
    a = bursty_stream(config, np.random.default_rng(7))
    b = bursty_stream(config, np.random.default_rng(7))
    assert a == b


def test_bad_values_are_one_line_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(
        capsys, "workload", "bursty", "--mean-rps", "1", "--dispersion", "0.5",
        "--out", str(tmp_path / "x.csv"),
    )  # fmt: skip
    assert code == 2
    assert_one_line_error(err, "--dispersion")
    with pytest.raises(ConfigError, match="no request"):
        bursty_stream(BurstyConfig(), np.random.default_rng(0), [(0.0, 10.0, 0.0)])
