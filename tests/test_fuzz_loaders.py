"""Fuzzing the profile and Philly loaders with generated rows (issue 9, classes 3 and 5).

Generated CSV files (mostly valid cells, now and then ``-1``, ``0``, ``nan``, ``inf``,
``1e308``, an empty cell, text, a short or a long row, a blank line) go through the
library loaders, :func:`deepboot.perf.profiles.load_profiles` and
:func:`deepboot.sim.philly.read_philly`. Whatever the input, the loader either returns
or raises :class:`~deepboot.core.errors.InputError` naming a real line of a real file
(line 0: the file or folder as a whole), never another exception. What loads is then
used: a loaded profile answers step-time, gradient and progress queries with finite,
physically possible values, and a loaded trace feeds the workload generator.

``FUZZ_EXAMPLES`` (default 60) sets the number of examples per test.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepboot.core.errors import ConfigError, InputError
from deepboot.perf.profiles import (
    PLACEMENT_COLUMNS,
    SCALABILITY_COLUMNS,
    VALIDATION_COLUMNS,
    ProfiledApplication,
    load_profiles,
)
from deepboot.sim.philly import PHILLY_COLUMNS, PhillyConfig, generate_from_jobs, read_philly

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

ODD_NUMBERS = ["-1", "0", "nan", "inf", "-inf", "1e308", "-1e308", "1e-300", "", "x", "1e"]
"""Cells that are not, or are barely, numbers."""

OUTCOMES: dict[str, int] = {}
"""How the examples ended ("profile-loaded", "philly-error", ...)."""


def count(outcome: str) -> None:
    OUTCOMES[outcome] = OUTCOMES.get(outcome, 0) + 1


@st.composite
def cell(draw: st.DrawFn, rate: int, valid: list[str], odd: list[str] = ODD_NUMBERS) -> str:
    """A valid value, or (one time in ``rate``; never when ``rate`` is 0) an odd one."""
    if rate and draw(st.integers(0, rate - 1)) == 0:
        return draw(st.sampled_from(odd))
    return draw(st.sampled_from(valid))


@st.composite
def csv_text(draw: st.DrawFn, rate: int, header: tuple[str, ...], rows: list[list[str]]) -> str:
    """``header`` and ``rows`` as CSV, with now and then a short, long or blank row."""
    lines = [",".join(header)]
    if rate and draw(st.integers(0, 4 * rate - 1)) == 0:
        lines[0] = draw(st.sampled_from(["", ",".join(header[:-1]), lines[0] + ",extra"]))
    for row in rows:
        if rate and draw(st.integers(0, 2 * rate - 1)) == 0:
            row = draw(st.sampled_from([row[:-1], [*row, "1"], [], row[:1]]))
        lines.append(",".join(row))
        if rate and draw(st.integers(0, 4 * rate - 1)) == 0:
            lines.append("")
    return "\n".join(lines) + "\n"


RATES = st.sampled_from([0, 0, 100, 30, 10, 3])
"""One odd cell in this many (0: none), drawn once per example."""


@st.composite
def profile_files(draw: st.DrawFn) -> dict[str, str]:
    """File name -> text of one model's profile folder."""
    rate = draw(RATES)

    def c(valid: list[str], odd: list[str] = ODD_NUMBERS) -> str:
        return draw(cell(rate, valid, odd))

    step, sync, bsz = ["0.5", "1.5", "2.5"], ["0.0", "0.1", "0.4"], ["4", "8", "16"]
    placements = [
        [c(["1", "2", "4", "11", "22", "12"], ["0", "10", "", "x", "-1", "1.5", "9" * 50]), c(bsz)]
        + [c(step), c(sync)]
        for _ in range(draw(st.integers(1, 6)))
    ]
    scalability = [
        [c(["2", "3"]), c(["3", "6", "8"]), c(bsz), c(step), c(sync)]
        for _ in range(draw(st.integers(1, 4)))
    ]
    files = {
        "placements.csv": draw(csv_text(rate, PLACEMENT_COLUMNS, placements)),
        "scalability.csv": draw(csv_text(rate, SCALABILITY_COLUMNS, scalability)),
    }
    names = ["validation-8.csv", "validation-16.csv", "validation-64.csv"]
    odd_names = ["validation-0.csv", "validation-x.csv", "validation-08.csv", "validation-.csv"]
    for _ in range(draw(st.integers(1, 2))):
        rows = [
            # Cumulative progress and iteration counts, as in a real file.
            [c([f"{10.0 * (e + 1)}"]), c([f"{7 * (e + 1)}"]), c(["0.5", "-3", "88"])]
            + [c(["0", "1.5", "3e5"]), c(["0", "2", "6e9"])]
            for e in range(draw(st.integers(1, 4)))
        ]
        files[c(names, odd_names)] = draw(csv_text(rate, VALIDATION_COLUMNS, rows))
    return files


@st.composite
def philly_text(draw: st.DrawFn) -> str:
    rate = draw(RATES)

    def c(valid: list[str], odd: list[str] = ODD_NUMBERS) -> str:
        return draw(cell(rate, valid, odd))

    odd_times = ["", "x", "2017-13-01 00:00:00", "2017-10-09 25:00:00", "1e308", "0"]
    rows = [
        [c(["2017-10-09 07:01:55", "2017-10-09 03:00:00", "2017-10-10 23:59:59"], odd_times)]
        + [c(["66.0", "600", "3600"], [*ODD_NUMBERS, "4e7"])]
        + [c(["1", "2", "8"], ["0", "-1", "1.5", "100000", "", "x", "1e3"])]
        + [c(["66.0", "7200", "400000"], [*ODD_NUMBERS, "1e300"]), c(["c0", "c1"], [""])]
        for _ in range(draw(st.integers(0, 6)))
    ]
    return draw(csv_text(rate, PHILLY_COLUMNS, rows))


def assert_names_a_real_line(err: InputError, columns: tuple[str, ...]) -> None:
    """``err`` points at a line of an existing file (or at a file or folder: line 0)."""
    path = Path(err.path)
    assert path.exists(), err
    assert err.line >= 0, err
    assert "\n" not in str(err), err
    if err.line == 0:
        return
    assert path.is_file(), err
    lines = path.read_text(encoding="utf-8-sig").split("\n")
    assert err.line <= len(lines), err
    if not any(line.strip() for line in lines):
        assert err.line == 1, err  # an empty file: where the header should be
        return
    assert lines[err.line - 1].strip(), err  # a blank line is never to blame
    if err.line > 1 and lines[0] == ",".join(columns):
        assert err.field in columns, err


def check_loaded_profile(app: ProfiledApplication) -> None:
    """A loaded profile gives finite, physically possible answers to every query."""
    lim = app.limits
    for shape in [(1,), (2,), (1, 1), (2, 2), (4, 4, 4), (1,) * 20]:
        for local in {1, lim.min_local_bsz, lim.max_local_bsz, 1000}:
            step, sync = app.step_time(shape, local)
            assert math.isfinite(step) and step > 0, (shape, local, step)
            assert math.isfinite(sync) and -1e-9 * step <= sync <= step * (1 + 1e-9), (step, sync)
    for batch in {1, lim.init_batch_size, lim.max_batch_size, 10**6}:
        for epoch in (0, 1, app.max_epochs + 3):
            sqr, var = app.grad_stats(batch, epoch)
            assert math.isfinite(sqr) and sqr >= 0, (batch, epoch, sqr)
            assert math.isfinite(var) and var >= 0, (batch, epoch, var)
    progress = [app.progress_at(e) for e in range(app.max_epochs + 3)]
    assert all(math.isfinite(p) for p in progress), progress
    assert all(b > a for a, b in zip(progress, progress[1:], strict=False)), progress


@FUZZ
@given(files=profile_files())
def test_profile_loader_returns_or_names_a_line(files: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "toy"
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8")
        try:
            apps = load_profiles(tmp)
        except InputError as err:
            columns = {
                "placements.csv": PLACEMENT_COLUMNS,
                "scalability.csv": SCALABILITY_COLUMNS,
            }.get(Path(err.path).name, VALIDATION_COLUMNS)
            assert_names_a_real_line(err, columns)
            count("profile-error")
            return
        check_loaded_profile(apps["toy"])
        count("profile-loaded")


@FUZZ
@given(text=philly_text())
def test_philly_loader_returns_or_names_a_line(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "philly.csv"
        path.write_text(text, encoding="utf-8")
        try:
            trace = read_philly(path)
        except InputError as err:
            assert err.path == str(path)
            assert_names_a_real_line(err, (*PHILLY_COLUMNS, "header"))
            count("philly-error")
            return
        for job in trace:
            assert 1 <= job.line <= len(text.split("\n")), job
            assert math.isfinite(job.duration) and job.duration >= 0, job
            assert math.isfinite(job.gpu_time) and job.gpu_time >= 0, job
            assert job.num_gpus >= 1, job
        try:
            jobs = generate_from_jobs(
                trace, 1, 24, np.random.default_rng(0), PhillyConfig(min_duration_s=0)
            )
        except ConfigError:
            count("philly-loaded")  # every row above the longest GPU-time class
            return
        assert len(jobs) == 1 and 0 <= jobs[0].submit_time < 24 * 3600, jobs
        count("philly-loaded")


def test_the_campaign_reached_both_outcomes() -> None:
    # Runs after the fuzz tests in file order: some inputs loaded, some were refused.
    if not OUTCOMES:
        pytest.skip("run together with the fuzz tests")
    for kind in ("profile", "philly"):
        assert OUTCOMES.get(f"{kind}-loaded", 0) >= 3, OUTCOMES
        assert OUTCOMES.get(f"{kind}-error", 0) >= 3, OUTCOMES
