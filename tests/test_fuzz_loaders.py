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

Services files (issue 19 part 2) are fuzzed with the DeepBoot workloads that use them:
a generated ``[[service]]`` file (now and then bad TOML, an unknown key, a bad or
non-finite value, a duplicate name, a missing cold start, a control character, an odd
header or line break, inline tables) and a workload whose inference rows name services
in and out of it go through :func:`~deepboot.sim.services.read_services_file` and
:func:`~deepboot.sim.workload.load_workload`: they load (every inference task's
service is the file's, with a finite cold start >= 0 and its concurrency and replica
cap in range), or an InputError names one of the two files, the line of the service at
fault (0: the file as a whole) and says so in one line. A few of them also go through
``deepboot simulate --services`` in-process: exit 0 or 2, never a traceback. What the
fuzzing found (:data:`FOUND`) is fixed; its triggers are still generated, and its
minimal reproducers are tests of their own.

``FUZZ_EXAMPLES`` (default 60) sets the number of examples per test (a tenth of it for
the in-process ``deepboot simulate`` runs).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import os
import tempfile
import tomllib
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from deepboot.cli.main import main as cli_main
from deepboot.core.errors import ConfigError, InputError
from deepboot.core.jobs import Workload
from deepboot.core.params import BatchLimits
from deepboot.core.service import MAX_CONCURRENCY, ServiceSpec
from deepboot.core.service import MAX_REPLICAS as MAX_SERVICE_REPLICAS
from deepboot.core.servicefile import dump_services, load_services, printable
from deepboot.perf.catalog import load_catalog
from deepboot.perf.profiles import (
    PLACEMENT_COLUMNS,
    SCALABILITY_COLUMNS,
    VALIDATION_COLUMNS,
    ProfiledApplication,
    load_profiles,
)
from deepboot.runtime.client.rateprofile import MAX_PROFILE_TIME_S, MAX_REQUESTS, RateProfile
from deepboot.sim.philly import PHILLY_COLUMNS, PhillyConfig, generate_from_jobs, read_philly
from deepboot.sim.services import ServicesFile, bind_services, read_services_file
from deepboot.sim.traces import azure_llm, compose, genai, rateshape
from deepboot.sim.traces.common import request_rows, write_rows
from deepboot.sim.workload import DEEPBOOT_COLUMNS, POLLUX_COLUMNS, load_workload

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


# ------------------------------------------------------------------ services files

SERVICE_NAMES = ["a", "b", "img.v2", "bert-1"]
"""The names a generated services file gives (rows name them ``infer-<name>``, dots,
dashes and digits included)."""

LINE_BREAKS = ["\u2028", "\u2029", "\x85"]
"""Characters TOML allows in comments and strings at which ``str.splitlines`` breaks a
line (TOML, tomllib and editors do not)."""

FOUND = {
    "line-breaks": "servicefile.header_lines numbered lines with str.splitlines, which also "
    "breaks at U+2028, U+2029 and U+0085 (legal in TOML comments and strings): every "
    "[[service]] header after one was numbered one line too far",
    "string-header": "servicefile.header_lines took a '[[service]]' line inside a "
    "multi-line string for a header: the services after it got the wrong header lines",
    "quoted-header": 'servicefile.header_lines missed a quoted header ([["service"]], '
    "valid TOML): the services after it got the next service's header line (or 0)",
    "raw-key": "servicefile.parse_services put an unknown key into InputError.field as "
    "written: a quoted key with a newline or an escape character made a multi-line "
    "message (and reached the terminal raw)",
    "huge-cold-start": "a service's cold_start_s was checked finite and >= 0 but not "
    "bounded: two tasks of 1e308 s cold starts overflowed the summary's mean delay to "
    "inf, and 'deepboot simulate --summary-json' wrote the non-JSON token Infinity "
    "(now cold_start_s <= 86400)",
}
"""Loader bugs the services fuzz tests found, all fixed. A draft's ``bugs`` says which
of their triggers it holds (the generator keeps making them)."""


@dataclass
class DraftTable:
    """One generated ``[[service]]`` table: the 1-based line of its header (0: an
    inline table) and the keys written in it (as TOML reads them)."""

    header: int
    keys: list[str]


@dataclass
class ServicesDraft:
    """A generated services file and what the generator knows about it.

    Attributes:
        data: The file's bytes.
        tables: Its service tables, in file order.
        top_keys: Its top-level keys other than ``service``.
        names: The valid service names it gives (workloads name them).
        exact: False when ``tables`` and ``top_keys`` may not describe what a TOML
            reader sees (a mangled file, an odd header): then only the weak checks.
        bugs: The triggers of fixed bugs (:data:`FOUND`) the file holds.
    """

    data: bytes
    tables: list[DraftTable]
    top_keys: set[str]
    names: list[str]
    exact: bool
    bugs: set[str]


@st.composite
def services_draft(draw: st.DrawFn) -> ServicesDraft:
    """A services file: mostly valid tables, with now and then bad TOML, an unknown
    key, a bad or non-finite value, a duplicate name, a missing cold start, a control
    character, an odd header form or line break, inline tables or a mangled file."""
    rate = draw(RATES)
    c = drawer(draw, rate)

    def odd() -> bool:
        return bool(rate) and draw(st.integers(0, rate - 1)) == 0

    bugs: set[str] = set()
    exact = True
    n = 0 if odd() else draw(st.integers(1, 3))
    names = list(draw(st.permutations(SERVICE_NAMES))[:n])
    odd_names = ['""', '"a b"', '"-a"', f'"{"n" * 64}"', '"a\\u0007"', "1", '"a\\n"', '"é"']
    odd_models = ['""', "1", '"m\\u001b[31m"', '"m\\n"', f'"m{draw(st.sampled_from(LINE_BREAKS))}"']
    bad_strings = ["1", '"""\nmulti\nline"""', '"""\n[[service]]\n"""']
    unknown = ["colds_start_s", "Name", "replicas", '"cold start"']
    raw_keys = ['"\\u001b[2J"', '"a\\nb"', '"x\\u0085"', '"\\u0000"']
    tables: list[list[tuple[str, str, str]]] = []  # (key as written, as read, value)
    for i, name in enumerate(names):
        entries: list[tuple[str, str, str]] = []
        if not odd():
            value = c([f'"{name}"'], odd_names)
            if i and odd():
                value = f'"{names[i - 1]}"'  # a duplicate name
            entries.append(("name", "name", value))
        if not odd():
            model = c(['"llama-7b"', '"sd-xl"', '"M0002"'], odd_models)
            bugs |= {"line-breaks"} if any(b in model for b in LINE_BREAKS) else set()
            entries.append(("model", "model", model))
        if not (odd() or draw(st.integers(0, 5)) == 0):
            valid = ["20.0", "0.0", "5", "22.7", "-0.0", "1e308"]
            bad = ["-1.0", "inf", "-inf", "nan", "1e400", "true", '"5"', "1979-05-27", "[1]"]
            entries.append(("cold_start_s", "cold_start_s", c(valid, bad)))
        if draw(st.booleans()):
            bad = ["0", "1025", "1.5", "-1", "true", '"2"', "inf"]
            entries.append(("concurrency", "concurrency", c(["1", "2", "1024"], bad)))
        if draw(st.booleans()):
            bad = ["-1", "4097", "2.0", "nan"]
            entries.append(("max_replicas", "max_replicas", c(["0", "3", "4096"], bad)))
        if draw(st.integers(0, 3)) == 0:
            key, value = draw(
                st.sampled_from(
                    [
                        ("request_timeout_s", c(["60.0", "0.5"], ["0", "86401", "nan"])),
                        ("load_timeout_s", c(["300", "1e-3"], ["-inf", "0.0"])),
                        ("handler", c(['""', '"pkg.mod:make"'], bad_strings)),
                        ("queue_bound", c(["64"], ["0", "1e5"])),
                        ("max_body_bytes", c(["1024"], ["0", "67108865"])),
                        ("args", c(["{x = 1}", "{}", "{x = inf}"], ["3", '"x"'])),
                    ]
                )
            )
            bugs |= {"string-header"} if "[[service]]" in value else set()
            entries.append((key, key, value))
        if odd():
            key = draw(st.sampled_from(unknown + raw_keys))
            if key in raw_keys:
                bugs.add("raw-key")
            entries.append((key, tomllib.loads(f"{key} = 1").popitem()[0], "1"))
        if entries and odd():
            entries.append(entries[0])  # a key twice: bad TOML
        tables.append(draw(st.permutations(entries)))

    chunks: list[str] = []  # each becomes a line (more, when it holds a newline)
    comment = c(
        ["# Services of w.csv", "# é ü", ""], [*(f"# x{b}y" for b in LINE_BREAKS), "# \x07"]
    )
    bugs |= {"line-breaks"} if any(b in comment for b in LINE_BREAKS) else set()
    chunks.append(comment)
    top_keys: set[str] = set()
    if odd():
        key = draw(st.sampled_from(["version", '"\\u0007"', "services"]))
        if key.startswith('"'):
            bugs.add("raw-key")
        chunks.append(f"{key} = 1")
        top_keys.add(tomllib.loads(f"{key} = 1").popitem()[0])
    headers: list[int] = []
    if tables and odd():  # every service as an inline table of one array
        inline = ", ".join("{" + ", ".join(f"{k} = {v}" for k, _, v in t) + "}" for t in tables)
        chunks.append(f"service = [{inline}]")
        headers = [0] * len(tables)
    else:
        for table in tables:
            valid = ["[[service]]", "[[ service ]]", "[[service]]  # next", "  [[service]]"]
            header = c(valid, ['[["service"]]', "[service]", "[[services]]", "[[service.x]]"])
            if header == '[["service"]]':
                bugs.add("quoted-header")
            elif header not in valid:
                exact = False  # a table, a top-level key or a sub-table instead
            if draw(st.booleans()):
                chunks.append("")
            headers.append(sum(chunk.count("\n") + 1 for chunk in chunks) + 1)
            chunks.append(header)
            chunks += [f"{k} = {v}" for k, _, v in table]
    text = "\n".join(chunks) + "\n"
    if odd():
        text = text.replace("\n", "\r\n")
    data = text.encode("utf-8")
    if odd():  # bad TOML, or no text at all
        exact = False
        how = draw(st.sampled_from(["cut", "quote", "equals", "control", "bytes", "bom"]))
        at = draw(st.integers(0, len(text)))
        if how == "cut":
            text = text[:at]
        elif how == "quote" and '"' in text:
            at = draw(st.sampled_from([i for i, ch in enumerate(text) if ch == '"']))
            text = text[:at] + text[at + 1 :]
        elif how in ("equals", "control"):
            text = text[:at] + ("\n= =\n" if how == "equals" else "\x01") + text[at:]
        elif how == "bom":
            text = "\ufeff" + text
        data = text.encode("utf-8")
        if how == "bytes":
            data = data[:at] + b"\xff" + data[at:]
    return ServicesDraft(
        data,
        [DraftTable(h, [k for _, k, _ in t]) for h, t in zip(headers, tables, strict=True)],
        top_keys,
        names,
        exact,
        bugs,
    )


@st.composite
def services_workload(draw: st.DrawFn, names: list[str]) -> tuple[str, tuple[str, ...]]:
    """A DeepBoot workload (now and then a Pollux one) whose first row trains, whose
    second is an inference row, and whose inference rows mostly name the services
    ``names``; its text and header."""
    rate = draw(RATES)
    c = drawer(draw, rate)

    infer = [f"infer-{n}" for n in names] or ["infer-a"]
    outside = [f"infer-{n}" for n in [*SERVICE_NAMES, "zzz"] if n not in names]
    odd_apps = [*outside, "infer-", "infer-A", "infer-a-1", "infer-é", "a", "infer-a\u2028"]
    rows = []
    for i in range(draw(st.integers(2, 6))):
        name = c([f"j{i}"], ["", "j0"])
        time = c(["0", "5", "600"], [*ODD_NUMBERS, "2e9"])
        if i == 0 or (i > 1 and draw(st.integers(0, 2)) == 0):
            app = c(["cifar10", "bert"], ["", "bogus", *infer])
            rows.append([name, time, app, c(["1", "2"], ["0", "x"]), c(["64"], ["0", "99999"])])
            rows[-1] += ["-1", "-1"]
        else:
            rows.append([name, time, c(infer, odd_apps), c(["1"], ["2", "0"]), c(["1"], ["4"])])
            rows[-1] += [c(["2.5", "30"], ["0", "-1", "inf", "nan", "x"])]
            rows[-1] += [c(["1", "7", "0"], ["-1", "1.5", "2e9"])]
    header = DEEPBOOT_COLUMNS
    if rate and draw(st.integers(0, rate - 1)) == 0:
        header, rows = POLLUX_COLUMNS, [row[:5] for row in rows]
    return draw(csv_text(rate, header, rows)), header


@st.composite
def services_case(draw: st.DrawFn) -> tuple[ServicesDraft, str, tuple[str, ...]]:
    """A services file and a workload whose rows (mostly) name its services."""
    draft = draw(services_draft())
    text, header = draw(services_workload(draft.names))
    return draft, text, header


@functools.cache
def catalog() -> tuple[frozenset[str], dict[str, BatchLimits]]:
    """The built-in catalog's model names and batch limits (what the CLI loads with)."""
    apps = load_catalog()
    return frozenset(apps), {name: app.limits for name, app in apps.items()}


def one_line(message: str) -> bool:
    """No line break, line or paragraph separator, or other control character."""
    return not any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in message)


def misplaced(err: InputError, draft: ServicesDraft) -> str:
    """Why a services file error names the wrong line ("" when it does not): an error
    about one service names the line of that service's header, one about the file as a
    whole names line 0."""
    if not draft.exact or err.message.startswith(("not valid TOML", "cannot read")):
        return ""
    by_line = {t.header: t for t in draft.tables if t.header}
    if err.line == 0:
        whole = err.field in ("", "service") or err.field in {printable(k) for k in draft.top_keys}
        return "" if whole or not by_line else "line 0 for an error in a service"
    table = by_line.get(err.line)
    if table is None:
        return f"line {err.line} is no service's header (headers: {sorted(by_line)})"
    if err.field == "cold_start_s" and "has none" in err.message:
        return "" if "cold_start_s" not in table.keys else "that service has a cold start"
    keys = {printable(k) for k in table.keys}
    if err.field not in ("", "name", "model", "service") and err.field not in keys:
        return f"the service on line {err.line} has no key {err.field!r}"
    return ""


def check_services_error(
    err: InputError, draft: ServicesDraft, spath: Path, wpath: Path, header: tuple[str, ...]
) -> None:
    """``err`` names one of the two files, a real line of it, in one line."""
    assert err.path in (str(spath), str(wpath)), err
    if err.path == str(wpath):
        assert one_line(str(err)), err
        assert_names_a_real_line(err, header)
        count("services-error-workload")
        return
    count("services-error-file")
    assert one_line(str(err)), err
    assert err.line >= 0, err
    if err.line > 0:
        lines = spath.read_text(encoding="utf-8").split("\n")
        assert err.line <= len(lines), (err, len(lines))
    problem = misplaced(err, draft)
    assert not problem, (problem, str(err), draft.data)


def check_bound(workload: Workload, services: ServicesFile, draft: ServicesDraft) -> None:
    """Every inference task names a service of the file, whose spec the workload
    keeps: a finite cold start >= 0, concurrency and replica cap in range."""
    used = {s.name: s for s in workload.services}
    assert len(used) == len(workload.services), workload.services
    assert {t.service for t in workload.inference} == set(used), workload
    for task in workload.inference:
        spec = services.specs[task.service]
        assert used[task.service] == spec and task.model == spec.model, (task, spec)
        cold = spec.cold_start_s
        assert cold is not None and math.isfinite(cold) and cold >= 0, spec
        assert 1 <= spec.concurrency <= MAX_CONCURRENCY, spec
        assert 0 <= spec.max_replicas <= MAX_SERVICE_REPLICAS, spec
        assert math.isfinite(task.duration) and task.duration > 0, task
        assert task.num_task >= 0 and math.isfinite(task.submit_time), task
    rebound = bind_services(workload, services)
    assert {s.name: s for s in rebound.services} == used, rebound.services
    if draft.exact:
        lines = [services.lines[name] for name in services.specs]
        assert lines == [t.header for t in draft.tables], (lines, draft)


@FUZZ
@given(case=services_case())
def test_workload_with_a_services_file_loads_or_names_a_line(
    case: tuple[ServicesDraft, str, tuple[str, ...]],
) -> None:
    draft, text, header = case
    known, limits = catalog()
    with tempfile.TemporaryDirectory() as tmp:
        spath, wpath = Path(tmp) / "services.toml", Path(tmp) / "w.csv"
        spath.write_bytes(draft.data)
        wpath.write_text(text, encoding="utf-8")
        try:
            services = read_services_file(spath)
            workload = load_workload(wpath, known, limits, services)
        except InputError as err:
            check_services_error(err, draft, spath, wpath, header)
            count("services-error")
            return
        check_bound(workload, services, draft)
        count("services-loaded")
        if workload.inference:
            count("services-loaded-inference")


VALID_CASE = (
    ServicesDraft(
        b'[[service]]\nname = "a"\nmodel = "m"\ncold_start_s = 2.0\nconcurrency = 2\n',
        [DraftTable(1, ["name", "model", "cold_start_s", "concurrency"])],
        set(),
        ["a"],
        True,
        set(),
    ),
    ",".join(DEEPBOOT_COLUMNS) + "\nj0,0,cifar10,1,64,-1,-1\nj1,5,infer-a,1,1,30,1\n",
    DEEPBOOT_COLUMNS,
)
"""One case that simulates, whatever the draws."""


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # huge-cold-start
@settings(FUZZ, max_examples=max(1, FUZZ.max_examples // 10))
@example(case=VALID_CASE)
@given(case=services_case())
def test_simulate_with_a_services_file_exits_0_or_2(
    case: tuple[ServicesDraft, str, tuple[str, ...]],
) -> None:
    draft, text, _ = case
    with tempfile.TemporaryDirectory() as tmp:
        spath, wpath = Path(tmp) / "services.toml", Path(tmp) / "w.csv"
        spath.write_bytes(draft.data)
        wpath.write_text(text, encoding="utf-8")
        argv = ["simulate", "--workload", str(wpath), "--services", str(spath), "--quiet"]
        argv += ["--policy", "deepboot", "--cluster", "2x4", "--inference-nodes", "1"]
        argv += ["--max-time", "600"]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(argv)
    assert code in (0, 2), (code, err.getvalue())
    assert "Traceback" not in err.getvalue(), err.getvalue()
    if code == 2:
        assert err.getvalue().splitlines()[-1].startswith("deepboot: error: "), err.getvalue()
    count(f"services-cli-{code}")


HEADER_BUGS = [
    pytest.param(
        '# a\u2028b\n[[service]]\nname = "a"\nmodel = "m"\nconcurrency = 0\n',
        2,
        id="line-breaks",
    ),
    pytest.param(
        '[[service]]\nname = "a"\nmodel = "m"\nhandler = """\n[[service]]\n"""\n'
        '[[service]]\nname = "b"\nmodel = "m"\nconcurrency = 0\n',
        7,
        id="string-header",
    ),
    pytest.param(
        '[["service"]]\nname = "a"\nmodel = "m"\nconcurrency = 0\n'
        '[[service]]\nname = "b"\nmodel = "m"\n',
        1,
        id="quoted-header",
    ),
]
"""The minimal reproducers of the line bugs: a services file whose ``concurrency = 0``
is in the service whose header is on ``line``."""


@pytest.mark.parametrize(("text", "line"), HEADER_BUGS)
def test_a_services_file_error_names_its_services_header(
    tmp_path: Path, text: str, line: int
) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as exc:
        read_services_file(path)
    if exc.value.field != "concurrency":
        pytest.fail(f"not the reproducer's error any more: {exc.value}")
    assert exc.value.line == line, str(exc.value)


@pytest.mark.parametrize("key", ['"a\\nb"', '"\\u001b[2J"'], ids=["newline", "escape"])
def test_an_unknown_keys_error_is_one_printable_line(tmp_path: Path, key: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(f'[[service]]\nname = "a"\nmodel = "m"\n{key} = 1\n', encoding="utf-8")
    with pytest.raises(InputError) as exc:
        read_services_file(path)
    if not exc.value.message.startswith("unknown key"):
        pytest.fail(f"not the reproducer's error any more: {exc.value!r}")
    assert one_line(str(exc.value)), repr(str(exc.value))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_a_huge_cold_start_is_refused_or_summarized_in_json(tmp_path: Path) -> None:
    services, workload = tmp_path / "s.toml", tmp_path / "w.csv"
    services.write_text(
        "".join(f'[[service]]\nname = "{n}"\nmodel = "m"\ncold_start_s = 1e308\n' for n in "ab"),
        encoding="utf-8",
    )
    rows = ["j0,0,cifar10,1,64,-1,-1", "j1,5,infer-a,1,1,30,1", "j2,5,infer-b,1,1,30,1"]
    workload.write_text("\n".join([",".join(DEEPBOOT_COLUMNS), *rows]) + "\n", encoding="utf-8")
    out = tmp_path / "summary.json"
    argv = ["simulate", "--workload", str(workload), "--services", str(services), "--quiet"]
    argv += ["--policy", "deepboot", "--cluster", "2x4", "--inference-nodes", "1"]
    argv += ["--max-time", "600", "--summary-json", str(out)]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    if code not in (0, 2):
        pytest.fail(f"exit {code}: {err.getvalue()}")
    if code == 0:

        def refuse(token: str) -> None:
            raise AssertionError(f"{token} in the summary JSON")

        json.loads(out.read_text(encoding="utf-8"), parse_constant=refuse)


def test_the_campaign_reached_both_outcomes() -> None:
    # Runs after the fuzz tests in file order: some inputs loaded, some were refused.
    if not OUTCOMES:
        pytest.skip("run together with the fuzz tests")
    for kind in ("profile", "philly", "genai", "loads", "azure", "qps", "compose", "services"):
        if f"{kind}-loaded" not in OUTCOMES and f"{kind}-error" not in OUTCOMES:
            continue  # that kind's fuzz test ran in another process (pytest -n)
        assert OUTCOMES.get(f"{kind}-loaded", 0) >= 3, OUTCOMES
        assert OUTCOMES.get(f"{kind}-error", 0) >= 3, OUTCOMES
    # A services example loaded with inference tasks; one refused for each file.
    for outcome in ("loaded-inference", "error-file", "error-workload"):
        assert OUTCOMES.get(f"services-{outcome}", 0) >= 3, OUTCOMES
