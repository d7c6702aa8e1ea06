"""Fuzzing the profile, Philly and production-trace loaders with generated rows (issue 9,
classes 3 and 5; issue 19 part 3 for the traces).

Generated CSV files (mostly valid cells, now and then ``-1``, ``0``, ``nan``, ``inf``,
``1e308``, an empty cell, text, a short or a long row, a blank line) go through the
library loaders, :func:`deepboot.perf.profiles.load_profiles`,
:func:`deepboot.sim.philly.read_philly` and the trace loaders of
:mod:`deepboot.sim.traces` (GenAI requests and model loads, Azure LLM requests, QPS
samples, and compose's training and stream readers). Whatever the input, the loader
either returns or raises :class:`~deepboot.core.errors.InputError` naming a real line of
a real file (line 0: the file or folder as a whole), never another exception. What loads is then
used: a loaded profile answers step-time, gradient and progress queries with finite,
physically possible values, a loaded trace feeds the workload generator, and a loaded
inference trace becomes a stream whose workload rows and services file read back.

``FUZZ_EXAMPLES`` (default 60) sets the number of examples per test.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepboot.core.errors import ConfigError, InputError
from deepboot.core.service import ServiceSpec
from deepboot.core.servicefile import dump_services, load_services
from deepboot.perf.profiles import (
    PLACEMENT_COLUMNS,
    SCALABILITY_COLUMNS,
    VALIDATION_COLUMNS,
    ProfiledApplication,
    load_profiles,
)
from deepboot.runtime.loadgen import MAX_PROFILE_TIME_S, MAX_REQUESTS, RateProfile
from deepboot.sim.philly import PHILLY_COLUMNS, PhillyConfig, generate_from_jobs, read_philly
from deepboot.sim.traces import azure_llm, compose, genai, rateshape
from deepboot.sim.traces.common import request_rows, write_rows
from deepboot.sim.workload import DEEPBOOT_COLUMNS, POLLUX_COLUMNS

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


# ------------------------------------------------------------------ production traces

GENAI_COLUMNS = (
    "gmt_create", "predict_type", "predict_status", "exec_time_seconds", "groupId",
    "prompt_length", "negative_prompt_length", "num_images_per_prompt",
    "num_inference_steps", "checkpoint_model_version_id", "num_lora",
)  # fmt: skip
"""The header of ``lora_request_trace.csv``."""

ODD_TIMES = [
    "",
    "x",
    "2024-13-01 00:00:00",
    "2024-11-15 25:00:00",
    "0",
    "2024-11-15T01:00:00+08:00",
]


def drawer(draw: st.DrawFn, rate: int) -> Callable[..., str]:
    """``c(valid, odd=ODD_NUMBERS)``: one cell (see :func:`cell`) at ``rate``."""

    def c(valid: list[str], odd: list[str] = ODD_NUMBERS) -> str:
        return draw(cell(rate, valid, odd))

    return c


@st.composite
def genai_text(draw: st.DrawFn) -> str:
    rate = draw(RATES)
    c = drawer(draw, rate)

    rows = [
        [c(["2024-11-15 16:57:50", "2024-11-16 03:00:00", "2024-12-08 17:33:57"], ODD_TIMES)]
        + [c(["TXT_2_IMG", "IMG_2_IMG"], ["", "x"])]
        + [c(["SUCCEED", "SUCCEED", "FAILED", "PENDING", "PROCESSING"], ["", "DONE", "succeed"])]
        + [c(["23.0", "0.0", "106", "3.0"], [*ODD_NUMBERS, "2e6"])]
        + [c(["G0001"], [""]), c(["93.0"]), c(["", "26.0"]), c(["1.0"]), c(["40.0"])]
        + [c(["M0002", "M0001", "", "a b/c", "other"], ["", "-x", "é" * 70])]
        + [c(["0", "2"])]
        for _ in range(draw(st.integers(0, 8)))
    ]
    return draw(csv_text(rate, GENAI_COLUMNS, rows))


@st.composite
def loads_text(draw: st.DrawFn) -> str:
    rate = draw(RATES)
    c = drawer(draw, rate)

    rows = [
        [c(["1662859290.0", "-5", "0"]), c(["2639.0", "22718", "0"], [*ODD_NUMBERS, "1e9"])]
        + [c(["086b31f8", ""])]
        for _ in range(draw(st.integers(0, 5)))
    ]
    return draw(csv_text(rate, genai.LOAD_COLUMNS, rows))


@st.composite
def azure_text(draw: st.DrawFn) -> str:
    rate = draw(RATES)
    c = drawer(draw, rate)

    stamps = ["2023-11-16 18:15:46.6805900", "2023-11-16 18:15:50.9951690", "2023-11-16 19:14:08"]
    rows = [
        [c(stamps, ODD_TIMES), c(["374", "0", "14050"], [*ODD_NUMBERS, "1.5", "2e7"])]
        + [c(["44", "1000", "0"], [*ODD_NUMBERS, "12.0"])]
        for _ in range(draw(st.integers(0, 8)))
    ]
    return draw(csv_text(rate, azure_llm.COLUMNS, rows))


@st.composite
def qps_text(draw: st.DrawFn) -> str:
    rate = draw(RATES)
    c = drawer(draw, rate)

    rows = [
        [c(["1662859176.0", "1662859233.0", "1662859900", "1662860500"], [*ODD_NUMBERS, "1e12"])]
        + [
            c(["0.09", "3.255", "0"]),
            c(["dfe00e98", ""]),
            c(["Generative Requests", "API Requests"], [""]),
        ]
        for _ in range(draw(st.integers(0, 8)))
    ]
    return draw(csv_text(rate, rateshape.COLUMNS, rows))


@st.composite
def workload_text(draw: st.DrawFn, inference: bool) -> str:
    """A training workload (Pollux or DeepBoot columns) or an inference stream of the
    services ``a`` and ``b``."""
    rate = draw(RATES)
    c = drawer(draw, rate)

    if inference:
        apps, replicas, batch = ["infer-a", "infer-b"], ["1"], ["1"]
    else:
        apps, replicas, batch = ["cifar10", "bert", "infer-bert-1"], ["1", "6"], ["1", "2048"]
    rows = [
        [c([f"j{i}"], ["", "j0"]), c(["0", "53", "3600.5"], [*ODD_NUMBERS, "2e9"])]
        + [c(apps, ["", "infer-zzz", "a"]), c(replicas, ["0", "2", "1.5", "5000", "x"])]
        + [c(batch, ["0", "-3", "x", ""]), c(["23", "0.5"], ODD_NUMBERS), c(["1", "-1"])]
        for i in range(draw(st.integers(0, 6)))
    ]
    header = DEEPBOOT_COLUMNS
    if not inference and draw(st.booleans()):
        header, rows = POLLUX_COLUMNS, [row[:5] for row in rows]
    return draw(csv_text(rate, header, rows))


def load_or_name_a_line(
    tmp: str, name: str, text: str, read: object, columns: tuple[str, ...]
) -> object:
    """``read(path)`` of ``text`` written to ``name``; None when it raised an InputError
    that names a real line (checked), or a ConfigError."""
    path = Path(tmp) / name
    path.write_text(text, encoding="utf-8")
    try:
        return read(path)  # type: ignore[operator]
    except InputError as err:
        assert err.path == str(path)
        assert_names_a_real_line(err, (*columns, "header"))
        return None


def check_stream(tmp: str, stream: object) -> None:
    """A loaded stream's rows are valid inference rows and its services file reads back."""
    requests, services = stream.requests, stream.services  # type: ignore[attr-defined]
    assert requests and services
    names = {s.name for s in services}
    assert all(r.service in names and r.time >= 0 and r.duration > 0 for r in requests)
    assert [r.time for r in requests] == sorted(r.time for r in requests)
    path = Path(tmp) / "s.toml"
    path.write_text(dump_services(services, stream.notes), encoding="utf-8")  # type: ignore[attr-defined]
    assert load_services(path) == services
    rows = list(request_rows(requests))
    assert all(float(row[5]) > 0 for row in rows)


@FUZZ
@given(text=genai_text(), loads=loads_text(), top=st.sampled_from([None, 1, 2]))
def test_genai_loaders_return_or_name_a_line(text: str, loads: str, top: int | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trace = load_or_name_a_line(tmp, "trace.csv", text, genai.read_requests, GENAI_COLUMNS)
        measured = load_or_name_a_line(
            tmp, "loads.csv", loads, genai.read_load_latencies, genai.LOAD_COLUMNS
        )
        count("genai-error" if trace is None else "genai-loaded")
        count("loads-error" if measured is None else "loads-loaded")
        if trace is None:
            return
        config = genai.GenaiConfig(top=top, cold_start_s=None if measured else 3.0)
        try:
            stream = genai.genai_stream(trace, config, np.random.default_rng(0), measured)
        except ConfigError:
            return  # nothing left (every row PENDING or without a model)
        check_stream(tmp, stream)


@FUZZ
@given(text=azure_text(), hours=st.sampled_from([None, 0.5, 3.0]))
def test_azure_loader_returns_or_names_a_line(text: str, hours: float | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trace = load_or_name_a_line(
            tmp, "conv.csv", text, azure_llm.read_requests, azure_llm.COLUMNS
        )
        count("azure-error" if trace is None else "azure-loaded")
        if trace is None:
            return
        config = azure_llm.AzureConfig(hours=hours, max_requests=50)
        check_stream(tmp, azure_llm.azure_stream(trace, config, np.random.default_rng(0)))


@FUZZ
@given(text=qps_text(), window=st.sampled_from([60.0, 600.0]))
def test_qps_loader_returns_or_names_a_line(text: str, window: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        samples = load_or_name_a_line(tmp, "qps.csv", text, rateshape.read_qps, rateshape.COLUMNS)
        count("qps-error" if samples is None else "qps-loaded")
        if samples is None:
            return
        try:
            shape = rateshape.rate_shape(samples, 10.0, window)  # type: ignore[arg-type]
        except ConfigError:
            return  # less than one window, or nothing but zeros
        if shape.times[-1] > MAX_PROFILE_TIME_S or shape.expected_requests() > MAX_REQUESTS:
            return  # longer or larger than 'deepboot load' takes: the CLI refuses it
        path = Path(tmp) / "profile.csv"
        rateshape.write_profile(path, shape)
        profile = RateProfile.load(path)
        assert max(profile.rates) == 10.0 and len(profile.rates) == len(shape.rates)


@FUZZ
@given(training=workload_text(False), stream=workload_text(True))
def test_compose_readers_return_or_name_a_line(training: str, stream: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        jobs = load_or_name_a_line(tmp, "t.csv", training, compose.read_training, DEEPBOOT_COLUMNS)
        specs = [ServiceSpec("a", "A", cold_start_s=1.0), ServiceSpec("b", "B", concurrency=2)]
        toml = Path(tmp) / "s.toml"
        toml.write_text(dump_services(specs), encoding="utf-8")
        inference = load_or_name_a_line(
            tmp, "w.csv", stream, lambda p: compose.read_stream(p, specs, toml), DEEPBOOT_COLUMNS
        )
        count("compose-error" if jobs is None or inference is None else "compose-loaded")
        if jobs is None or inference is None:
            return
        config = compose.ComposeConfig(4, peak_busy=0.5, window_s=3600, max_requests=10_000)
        try:
            result = compose.compose(jobs, [inference], config, np.random.default_rng(0))  # type: ignore[arg-type]
        except ConfigError:
            return  # a name clash with a training job, or beyond the request cap

        out = Path(tmp) / "out.csv"
        write_rows(out, result.rows)
        assert out.read_text().count("\n") == len(result.rows) + 1


def test_the_campaign_reached_both_outcomes() -> None:
    # Runs after the fuzz tests in file order: some inputs loaded, some were refused.
    if not OUTCOMES:
        pytest.skip("run together with the fuzz tests")
    for kind in ("profile", "philly", "genai", "loads", "azure", "qps", "compose"):
        assert OUTCOMES.get(f"{kind}-loaded", 0) >= 3, OUTCOMES
        assert OUTCOMES.get(f"{kind}-error", 0) >= 3, OUTCOMES
