"""``deepboot status --watch``: the view fits 80 columns (long names cut with an
ellipsis, one line per row), the loop survives failed reads and stops cleanly, the
flags are checked. A real state directory and job store (SQLite), no Ray; time is
injected (no real sleep)."""

from __future__ import annotations

import argparse
import io
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from deepboot.cli import statusview
from deepboot.cli.main import main
from deepboot.cli.runtime import cmd_status
from deepboot.cli.statusview import read_once, status_view, watch
from deepboot.core.service import ServiceSpec
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.client.statusdoc import status_document
from deepboot.runtime.store.jobstore import GpuRow, JobState, JobStore
from deepboot.runtime.store.statedir import StateDir

LONG_JOB = "finetune-with-a-name-far-too-long-for-any-column-of-80"  # 54 characters
SHORT_JOB = "reg"
LONG_SERVICE = "chat-service-whose-name-is-also-much-too-long"
LONG_MODEL = "tiny-mlp-with-a-model-name-that-goes-on-and-on"


def _state(tmp_path: Path) -> StateDir:
    """A state directory as a controller leaves it: three jobs (one running on two
    training GPUs and a lent inference GPU), a service with two replicas, four GPUs
    per node on two nodes, and SLO counts."""
    state = StateDir.at(tmp_path / "state").ensure()
    store = JobStore(state.db)
    for i, name in enumerate([LONG_JOB, SHORT_JOB, LONG_JOB + "-2"]):
        store.submit(JobSpec(name=name, entry="m:f", min_workers=1, max_workers=4), now=i)
    with store.transaction() as db:
        store.save_job(
            db,
            replace(
                store.job(LONG_JOB),
                state=JobState.RUNNING,
                workers=("0.0", "0.1", "1.1"),
                local_bsz=32,
                accum=2,
                step=123456,
                loss=0.0123456,
                restarts=7,
            ),
        )
        store.save_job(db, replace(store.job(SHORT_JOB), state=JobState.QUEUED))
    store.register_service(ServiceSpec(LONG_SERVICE, LONG_MODEL, max_replicas=4))
    store.register_service(ServiceSpec("echo", "m"))
    gpus = [
        GpuRow("0.0", 0, 0, "training", "training", LONG_JOB),
        GpuRow("0.1", 0, 1, "training", "training", LONG_JOB),
        GpuRow("0.2", 0, 2, "training", "free"),
        GpuRow("0.3", 0, 3, "training", "free"),
        GpuRow("1.0", 1, 0, "inference", "running", "", LONG_SERVICE, "r1", 2),
        GpuRow("1.1", 1, 1, "inference", "lent", LONG_JOB),
        GpuRow("1.2", 1, 2, "inference", "protect", "", LONG_SERVICE, "r2", 0),
        GpuRow("1.3", 1, 3, "inference", "free"),
    ]
    slo = {LONG_SERVICE: {"window_s": 300.0, "recent": _counts(97, 3), "total": _counts(9, 1)}}
    with store.transaction() as db:
        store.save_gpus(db, gpus)
        store.set_meta(db, "heartbeat", repr(time.time() - 1.5))
        store.set_meta(db, "slo", json.dumps(slo))
    store.close()
    return state


def _counts(within: int, over: int) -> dict[str, Any]:
    return {"within": within, "over": over, "attainment": within / (within + over)}


def _render(renderable: Any, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text().splitlines()


def _row(lines: list[str], start: str) -> str:
    [line] = [x for x in lines if x.startswith(start)]
    return line


@pytest.mark.parametrize("width", [80, 100, 60])
def test_the_view_fits_the_width_and_cuts_long_names(tmp_path: Path, width: int) -> None:
    doc = status_document(_state(tmp_path))
    lines = _render(status_view(doc, width, refreshed=0.0), width)
    assert max(len(x) for x in lines) <= width
    if width != 80:
        return
    # Each job on one line, its name cut with an ellipsis, its numbers whole.
    jobs = [x for x in lines if x.startswith(LONG_JOB[:8])]
    assert len(jobs) == 2
    running = next(x for x in jobs if "running" in x)
    assert running.split()[0].endswith("…") and LONG_JOB not in running
    assert running.split()[-4:] == ["192", "123456", "0.01235", "7"]
    assert "3 (1 lent)" in running
    assert "queued" in _row(lines, SHORT_JOB + " ")
    # The service row: name and model cut, replicas by state, the last 5 minutes.
    service = _row(lines, LONG_SERVICE[:8])
    assert "…" in service and LONG_SERVICE not in service and LONG_MODEL not in service
    assert "2/4: 1 prot 1 run" in service and "97.0% 97/100" in service
    # GPUs: one line per node (4 GPUs fit at 80 columns in two lines), holders cut.
    node0 = _row(lines, "0 training")
    assert "0.0 training finetune" in node0 and "…" in node0
    assert any("1.1 lent finetune" in x for x in lines)


def test_the_header_shows_cluster_controller_heartbeat_and_time(tmp_path: Path) -> None:
    doc = status_document(_state(tmp_path))
    # No cluster.json, no controller: the view says so and shows the last record.
    text = "\n".join(_render(status_view(doc, 80, refreshed=0.0, every=2.0)))
    assert text.startswith("down · controller DOWN · heartbeat")
    assert "the controller is not running" in text and "every 2 s" in text
    doc["cluster"].update(up=True, mode="local", address="127.0.0.1:40611")
    doc["cluster"].update(controller_pid=4398, heartbeat_age_s=0.3)
    first = _render(status_view(doc, 80, refreshed=0.0))[0]
    assert first.startswith("local 127.0.0.1:40611 · controller up, pid 4398 · heartbeat 0.3")
    assert len(first) == 80 and first.endswith(statusview._clock(0.0))


def test_status_names_the_configuration_up_saved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``up`` runs, from controller.json: the watch's header and plain status
    name it (a state directory before ``up`` has none: no line)."""
    from deepboot.runtime.controller.controller_settings import ControllerSettings, settings_file
    from deepboot.world.settings import SharedCluster

    state = _state(tmp_path)
    assert status_document(state)["configuration"] is None
    shared = SharedCluster(slo=True, host_cache_gb=1.0)
    settings = ControllerSettings(policy="pollux", preset="guarded", interval=30.0, shared=shared)
    settings.save(settings_file(state))
    doc = status_document(state)
    assert doc["configuration"] == {
        "preset": "guarded",
        "policy": "pollux",
        "interval_s": 30.0,
        "described": "guarded = pollux, --slo, --host-cache-gb 1, --interval 30",
    }
    lines = _render(status_view(doc, 80, refreshed=0.0))
    assert lines[1] == "runs guarded = pollux, --slo, --host-cache-gb 1, --interval 30"
    code = main(["status", "--state-dir", str(state.root)])
    out = capsys.readouterr().out
    assert code == 0
    assert "configuration: guarded = pollux, --slo, --host-cache-gb 1, --interval 30" in out


def test_status_shows_the_guards_reading_of_each_services_demand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --slo the controller writes each service's forecast and burstiness
    (``demand`` meta); status and the watch show them, a line per service."""
    state = _state(tmp_path)
    demand = {"forecast_rps": 2.61, "dispersion": 9.8, "peakedness": 9.8, "peak_per_s": 41,
              "sized": 12}  # fmt: skip
    store = JobStore(state.db)
    with store.transaction() as db:
        store.set_meta(db, "demand", json.dumps({"echo": demand}))
    store.close()
    doc = status_document(state)
    by_name = {sv["name"]: sv for sv in doc["services"]}
    assert by_name["echo"]["demand"] == demand and by_name[LONG_SERVICE]["demand"] is None
    line = "echo: forecast 2.61/s, dispersion 9.8, busiest second 41, 12 replicas sized"
    assert any(line in x for x in _render(status_view(doc, 100, refreshed=0.0), 100))
    assert main(["status", "--state-dir", str(state.root)]) == 0
    assert f"demand (the SLO guard's reading): {line}" in capsys.readouterr().out


def test_p99_wait_is_shown_when_the_document_has_it(tmp_path: Path) -> None:
    doc = status_document(_state(tmp_path))
    doc["services"][0]["slo"]["p99_wait_s"] = 0.8234
    doc["services"][1]["slo"]["p99_wait_s"] = None  # before any request
    lines = _render(status_view(doc, 80, refreshed=0.0))
    assert max(len(x) for x in lines) <= 80
    assert "p99 wait" in _row(lines, "service ")
    assert _row(lines, LONG_SERVICE[:8]).endswith("0.82 s")
    assert _row(lines, "echo ").endswith("-")
    # A document without the key (an older deepboot's): no column, no error.
    for sv in doc["services"]:
        del sv["slo"]["p99_wait_s"]
    lines = _render(status_view(doc, 80, refreshed=0.0))
    assert "p99" not in _row(lines, "service ") and "97.0% 97/100" in "\n".join(lines)


def test_a_failed_read_is_retried_a_bounded_number_of_times() -> None:
    pauses: list[float] = []
    calls = []

    def read() -> dict[str, Any]:
        calls.append(1)
        raise OSError("gone\nfor now")

    assert read_once(read, pauses.append, attempts=3, pause=0.1) == (None, "gone for now")
    assert len(calls) == 3 and pauses == [0.1, 0.1]


def test_the_loop_stops_after_n_refreshes_and_survives_a_vanished_state_dir(
    tmp_path: Path,
) -> None:
    """The state directory vanishes after the second refresh (``deepboot down``,
    ``rm -r``): the screen says so above the last state read and keeps watching;
    when it comes back, so does the view."""
    state = _state(tmp_path)
    saved = tmp_path / "saved"
    shutil.copytree(state.root, saved)
    now = [1000.0]
    slept: list[float] = []
    frames: list[str] = []
    reads = [0]

    def read() -> dict[str, Any]:
        reads[0] += 1
        return status_document(state)

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds
        if seconds == 2.5:  # a tick, not a retry's pause
            frames.append("\n".join(_render(statusview_last[0])))
            ticks = len([s for s in slept if s == 2.5])
            if ticks == 2:
                shutil.rmtree(state.root)
            elif ticks == 4:
                shutil.copytree(saved, state.root)

    statusview_last: list[Any] = [None]
    real_view = statusview.status_view

    def view(*args: Any, **kwargs: Any) -> Any:
        statusview_last[0] = real_view(*args, **kwargs)
        return statusview_last[0]

    console = Console(width=80, file=io.StringIO())
    mp = pytest.MonkeyPatch()
    mp.setattr(statusview, "status_view", view)
    try:
        code = watch(read, console, 2.5, max_refreshes=5, sleep=sleep, clock=lambda: now[0])
    finally:
        mp.undo()
    assert code == 0
    # 5 refreshes, 4 ticks between them; the 3rd and 4th read 3 times each, 0.2 s apart.
    assert slept.count(2.5) == 4 and slept.count(0.2) == 4
    assert reads[0] == 3 * 1 + 2 * 3
    assert "cannot read" not in frames[1] and LONG_JOB[:8] in frames[1]
    for frame in frames[2:4]:
        assert "cannot read the status: no deepboot state in" in frame
        assert LONG_JOB[:8] in frame
        assert f"(shown: the state read at {statusview._clock(1002.5)})" in frame
    assert max(len(x) for f in frames for x in f.splitlines()) <= 80


def test_ctrl_c_ends_the_watch_with_0_and_the_cursor_shown() -> None:
    doc: dict[str, Any] = {
        "cluster": {
            "up": False, "mode": None, "address": None, "controller_pid": None,
            "heartbeat_age_s": None, "endpoint": None,
        },
        "gpus": [], "services": [], "caches": [], "jobs": [],
    }  # fmt: skip

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    out = io.StringIO()
    console = Console(width=80, file=out, force_terminal=True)
    assert watch(lambda: doc, console, 2.0, sleep=interrupt) == 0
    text = out.getvalue()
    assert "no jobs" in text and text.rstrip("\n").endswith("\x1b[?25h")  # cursor shown


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--watch", "--every", "0"], "--every must be a positive number, got 0.0"),
        (["--watch", "--every", "-1"], "--every must be a positive number"),
        (["--watch", "--every", "nan"], "--every must be a positive number"),
        (["--every", "5"], "add --watch"),
        (["--watch", "--json"], "--watch and --json"),
        (["--watch"], "no deepboot state"),
    ],
    ids=["zero", "negative", "nan", "no-watch", "json", "no-state"],
)
def test_bad_watch_flags_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    code = main(["status", *argv, "--state-dir", str(tmp_path / "nothing")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("deepboot: error:") and err.count("\n") == 1
    assert words in err


def test_status_watch_runs_from_the_command_line_until_ctrl_c(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state(tmp_path)
    ticks: list[float] = []

    def sleep(seconds: float) -> None:
        ticks.append(seconds)
        if len(ticks) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(statusview.time, "sleep", sleep)
    assert main(["status", "--watch", "--every", "0.5", "--state-dir", str(state.root)]) == 0
    assert ticks == [0.5, 0.5]
    assert LONG_JOB[:8] in capsys.readouterr().out


def test_plain_status_jobs_never_fold_at_80_columns(tmp_path: Path) -> None:
    """Without --watch: the full jobs table when it fits, else the compact one; names
    are never cut (a user greps for them), and each job stays on one line."""
    state = _state(tmp_path)
    out = Console(width=80, record=True, file=io.StringIO())
    args = argparse.Namespace(state_dir=str(state.root), json=False)
    assert cmd_status(args, out, Console(stderr=True)) == 0
    lines = out.export_text().splitlines()
    assert "workers" in _row(lines, "job ")
    assert "123456" in _row(lines, LONG_JOB + " ") and "queued" in _row(lines, SHORT_JOB + " ")
    wide = Console(width=200, record=True, file=io.StringIO())
    assert cmd_status(args, wide, Console(stderr=True)) == 0
    text = wide.export_text()
    assert "batch (local x accum)" in text and "3 [0.0, 0.1, 1.1]" in text


def test_plain_status_at_80_columns_keeps_every_header_whole(tmp_path: Path) -> None:
    """``deepboot status`` (not --watch) at 80 columns: the services and jobs tables
    fall back to their compact forms, whose headers and names are never cut."""
    state = _state(tmp_path)
    console = Console(width=80, record=True, file=io.StringIO())
    args = argparse.Namespace(state_dir=str(state.root), watch=False, every=None, json=False)
    assert cmd_status(args, console, console) == 0
    text = console.export_text()
    assert "…" not in text and "servi" not in text.replace("service", "")
    for header in ("service", "model", "replicas", "SLO", "last 5 min", "job", "resizes"):
        assert header in text, header
    assert LONG_SERVICE in text and LONG_MODEL in text and LONG_JOB in text
    assert text.count("(a narrow terminal: --json has every column)") == 2
