"""The runtime timeline: a real store written through JobStore's own API, the series
rebuilt from it checked exactly, the requests CSV's alignment, and the CLI's PNG."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deepboot.cli.timeline import read_state_dir
from deepboot.core.errors import ConfigError
from deepboot.report import timeline as tl
from deepboot.report.figures import matplotlib_available
from deepboot.report.timeline import (
    DOWN,
    IDLE,
    INFERENCE_POOL,
    JOB,
    REPLICA,
    TRAINING_POOL,
    RequestRow,
    Timeline,
    align_requests,
    build_timeline,
    load_offset,
    read_requests,
    sent_offset,
)
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.store.jobstore import EventRow, GpuRow, JobStore, LogKind
from tests.cli_helpers import assert_one_line_error, run_cli

T0 = 1_000_000.0
TRAINING_GPUS = ("0.0", "0.1", "1.0", "1.1")
INFERENCE_GPUS = ("2.0", "2.1")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(state: Path) -> None:
    """The event log of a short run, as the controller writes it (times: T0 + s).

    j1 starts on the 4 training GPUs, gives two to j2 and borrows the idle inference
    GPU 2.1, which a request spike reclaims at 20 s (a replica starts there at the
    same instant); j2 is preempted at 31 s and comes back on one GPU; both finish.
    """
    state.mkdir(parents=True, exist_ok=True)
    store = JobStore(state / "deepboot.db")
    try:
        with store.transaction() as db:
            store.save_gpus(
                db,
                [GpuRow(g, int(g[0]), int(g[2]), TRAINING_POOL, "free") for g in TRAINING_GPUS]
                + [GpuRow(g, 2, int(g[2]), INFERENCE_POOL, "free") for g in INFERENCE_GPUS],
            )

        def at(s: float, kind: LogKind, job: str = "", **detail: object) -> None:
            store.append(kind, job, now=T0 + s, **detail)

        def gpu(s: float, job: str, op: str, *gpus: str) -> None:
            for g in gpus:
                at(s, LogKind.GPU, job, gpu=g, op=op)

        at(-0.5, LogKind.RECONCILED, kept=[], killed=[])  # logged just before the start
        at(0, LogKind.CONTROLLER_STARTED, policy="deepboot", afe=True, recovered=[])
        store.submit(JobSpec(name="j1", entry="m:f", min_workers=1, max_workers=4), now=T0 + 1)
        at(2, LogKind.REPLICA, gpu="2.0", service="echo", op="start", cold=True)
        gpu(3, "j1", "bind", *TRAINING_GPUS)
        at(4, LogKind.REPLICA, gpu="2.0", service="echo", op="ready", seconds=2.0)
        store.submit(JobSpec(name="j2", entry="m:f", min_workers=1, max_workers=2), now=T0 + 5)
        at(8, LogKind.STARTED, "j1", generation=1, workers=list(TRAINING_GPUS))
        gpu(10, "j1", "release", "1.0", "1.1")
        gpu(10, "j1", "lend", "2.1")
        gpu(10, "j2", "bind", "1.0", "1.1")
        at(12, LogKind.RESIZED, "j1", **{"from": list(TRAINING_GPUS)}, to=["0.0", "0.1", "2.1"],
           how="restart", seconds=2.0)  # fmt: skip
        at(13, LogKind.STARTED, "j2", generation=1, workers=["1.0", "1.1"])
        gpu(20, "j1", "reclaim", "2.1")
        at(20, LogKind.REPLICA, gpu="2.1", service="echo", op="start", cold=True)
        at(22, LogKind.RESIZED, "j1", **{"from": ["0.0", "0.1", "2.1"]}, to=["0.0", "0.1"],
           how="afe", seconds=0.5)  # fmt: skip
        at(25, LogKind.REPLICA, gpu="2.1", service="echo", op="ready", seconds=5.0)
        at(30, LogKind.FINISHED, "j1", step=10, loss=0.1, seconds=29.0)
        gpu(30, "j1", "release", "0.0", "0.1")
        gpu(31, "j2", "release", "1.0", "1.1")
        at(31, LogKind.PREEMPTED, "j2", generation=1, workers=["1.0", "1.1"])
        gpu(35, "j2", "bind", "0.0")
        at(38, LogKind.RESIZED, "j2", **{"from": []}, to=["0.0"], how="restart", seconds=3.0)
        at(40, LogKind.REPLICA, gpu="2.0", service="echo", op="evict")
        at(50, LogKind.FINISHED, "j2", step=10, loss=0.1, seconds=37.0)
        gpu(50, "j2", "release", "0.0")
    finally:
        store.close()


def load_timeline(state: Path) -> tuple[Timeline, list[EventRow]]:
    events, pools = read_state_dir(state)
    return build_timeline(events, pools), events


@pytest.fixture
def state(tmp_path: Path) -> Path:
    root = tmp_path / "state"
    write_run(root)
    return root


def counts(job: int = 0, replica: int = 0, idle: int = 0, down: int = 0) -> dict[str, int]:
    return {JOB: job, REPLICA: replica, IDLE: idle, DOWN: down}


def test_gpus_by_state_per_pool(state: Path) -> None:
    timeline, _ = load_timeline(state)
    assert timeline.start == T0
    assert timeline.end == 50.0
    assert timeline.notes == ()
    training, inference = timeline.pools
    assert (training.pool, training.gpus) == (TRAINING_POOL, 4)
    assert (inference.pool, inference.gpus) == (INFERENCE_POOL, 2)
    # Instants whose entries cancel out (10 s: two GPUs released and bound again)
    # leave no point; the reconcile before the start counts as second 0.
    assert training.times == (0.0, 3.0, 30.0, 31.0, 35.0, 50.0)
    assert [training.at(t) for t in (0, 2.9, 3, 10, 29, 30, 31, 36, 50, 99)] == [
        counts(idle=4),
        counts(idle=4),
        counts(job=4),
        counts(job=4),
        counts(job=4),
        counts(job=2, idle=2),
        counts(idle=4),
        counts(job=1, idle=3),
        counts(idle=4),
        counts(idle=4),
    ]
    assert inference.times == (0.0, 2.0, 10.0, 20.0, 40.0)
    assert [inference.at(t) for t in (1, 2, 10, 19.9, 20, 39, 40)] == [
        counts(idle=2),
        counts(replica=1, idle=1),
        counts(job=1, replica=1),  # 2.1 lent to j1
        counts(job=1, replica=1),
        counts(replica=2),  # reclaimed, and a replica started there at once
        counts(replica=2),
        counts(replica=1, idle=1),
    ]
    assert timeline.replica_starts == (2.0, 20.0)


def test_workers_per_job_and_reclaims(state: Path) -> None:
    timeline, _ = load_timeline(state)
    j1, j2 = timeline.jobs
    # A point wherever its formed workers or its held GPUs change.
    assert (j1.name, j1.times) == ("j1", (1.0, 3.0, 8.0, 10.0, 12.0, 20.0, 22.0, 30.0))
    assert j1.workers == (0, 0, 4, 4, 3, 3, 2, 0)
    assert j1.held == (0, 4, 4, 3, 3, 2, 2, 0)
    # Starting from its GPUs' bind (3 s) until its workers formed (8 s): not idle.
    assert j1.starting() == (0, 4, 0, 0, 0, 0, 0, 0)
    assert (j1.reclaims, j1.ended, j1.ahead) == ((20.0,), "finished", ())
    assert (j2.name, j2.times) == ("j2", (5.0, 10.0, 13.0, 31.0, 35.0, 38.0, 50.0))
    assert j2.workers == (0, 0, 2, 0, 0, 1, 0)
    assert j2.starting() == (0, 2, 0, 0, 1, 0, 0)
    assert (j2.reclaims, j2.ended) == ((), "finished")
    assert [j1.at(t) for t in (0, 8, 19, 21, 22, 31)] == [0, 4, 3, 3, 2, 0]


def test_node_loss_and_unknown_gpus() -> None:
    """A node that leaves takes its GPUs (and what they held) down until it returns;
    a GPU of no known pool is placed by its first use, with a note."""

    def ev(seq: int, s: float, kind: LogKind, job: str = "", **d: object) -> EventRow:
        return EventRow(seq, T0 + s, kind, job, dict(d))

    log = [
        ev(1, 0, LogKind.CONTROLLER_STARTED),
        ev(2, 1, LogKind.GPU, "a", gpu="0.0", op="bind"),
        ev(3, 1, LogKind.GPU, "a", gpu="0.1", op="bind"),
        ev(4, 2, LogKind.REPLICA, gpu="9.0", op="start"),
        ev(5, 5, LogKind.NODE, node=0, op="left", gpus=["0.0", "0.1"]),
        ev(6, 9, LogKind.NODE, node=0, op="returned", gpus=["0.0", "0.1"]),
    ]
    timeline = build_timeline(log, {"0.0": TRAINING_POOL, "0.1": TRAINING_POOL})
    training, inference = timeline.pools
    assert training.at(1) == counts(job=2)
    assert training.at(5) == counts(down=2)
    assert training.at(9) == counts(idle=2)
    assert (inference.gpus, inference.at(2)) == (1, counts(replica=1))
    assert timeline.notes == ("GPUs of no known pool, placed by their first use: 9.0",)


def test_a_log_without_a_controller_start_counts_from_its_oldest_entry() -> None:
    log = [EventRow(7, T0 + 3, LogKind.GPU, "a", {"gpu": "0.0", "op": "bind"})]
    timeline = build_timeline(log, {"0.0": TRAINING_POOL})
    assert timeline.start == T0 + 3
    assert "pruned" in timeline.notes[0]
    empty = build_timeline([], {"0.0": TRAINING_POOL})
    assert (empty.start, empty.end, empty.jobs) == (0.0, 0.0, ())
    assert empty.pools[0].at(0) == counts(idle=1)


def test_pools_come_from_cluster_json_when_the_gpus_table_is_empty(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "deepboot.db")
    store.append(LogKind.CONTROLLER_STARTED, now=T0)
    store.close()
    (tmp_path / "cluster.json").write_text('{"nodes": [[0, "training", 2], [1, "inference", 1]]}')
    timeline, _ = load_timeline(tmp_path)
    assert [(p.pool, p.gpus) for p in timeline.pools] == [(TRAINING_POOL, 2), (INFERENCE_POOL, 1)]


def test_a_directory_without_a_store_is_refused_and_left_alone(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no job store in .*deepboot\.db"):
        read_state_dir(tmp_path)
    assert not (tmp_path / "deepboot.db").exists()


def test_the_kinds_read_are_the_logs_own() -> None:
    """report may not import runtime (the layers): its kind names must be LogKind's."""
    names = [tl.CONTROLLER_STARTED, tl.SUBMITTED, tl.STARTED, tl.RESIZED, tl.PREEMPTED]
    names += [tl.GPU, tl.REPLICA_KIND, tl.NODE, *tl.ENDED]
    assert all(LogKind(n).value == n for n in names)


# -- the requests CSV -----------------------------------------------------------------------


def test_requests_use_wait_when_the_csv_has_it(tmp_path: Path) -> None:
    with_wait = tmp_path / "w.csv"
    with_wait.write_text(
        "id,send_s,answer_s,status,latency_s,error,service,wait_s,exec_s\n"
        "1,3.0,3.5,200,0.5,,echo,0.25,0.2\n"
        "0,0.5,6.5,200,6.0,,echo,5.5,0.2\n"
        "2,,,0,,not sent (cancelled),echo,,\n"
        "3,4.0,34.0,0,30.0,timeout,echo,,\n"
    )
    metric, rows = read_requests(with_wait)
    assert metric == "wait_s"
    assert [(r.send_s, r.status) for r in rows] == [(3.0, 200), (0.5, 200), (4.0, 0)]
    assert rows[0].value == 0.25 and math.isnan(rows[2].value)
    plain = tmp_path / "p.csv"
    plain.write_text("id,send_s,answer_s,status,latency_s,error\n0,1.0,1.4,200,0.4,\n")
    assert read_requests(plain) == ("latency_s", [RequestRow(1.0, 0.4, 200)])


def test_bad_requests_csvs_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="no send_s, status, latency_s column"):
        read_requests(bad)
    bad.write_text("id,send_s,answer_s,status,latency_s,error\n0,x,1,200,1,\n")
    with pytest.raises(ConfigError, match="line 2"):
        read_requests(bad)
    with pytest.raises(ConfigError, match="cannot read requests CSV"):
        read_requests(tmp_path / "missing.csv")


def test_the_first_request_is_aligned_to_the_first_replica_start(state: Path) -> None:
    timeline, log = load_timeline(state)
    # The first replica started at 2 s: the first request (send_s 0.5) was sent then.
    assert load_offset(log, timeline.start, 0.5) == pytest.approx(1.5)
    # With the load's start known (bench/twin.py), the first start at or after it;
    # none after it: the load's start itself.
    assert load_offset(log, timeline.start, 0.0, after=T0 + 15) == pytest.approx(20.0)
    assert load_offset(log, timeline.start, 0.0, after=T0 + 60) == pytest.approx(60.0)
    aligned = align_requests(
        "latency_s", [RequestRow(2.0, 0.3, 200), RequestRow(0.5, 6.0, 503)], 1.5
    )
    assert (aligned.send, aligned.value, aligned.ok) == ((2.0, 3.5), (6.0, 0.3), (False, True))


def test_proactive_reclaims_are_told_apart(tmp_path: Path) -> None:
    write_run(tmp_path)
    store = JobStore(tmp_path / "deepboot.db")
    try:
        store.append(LogKind.GPU, "j1", now=T0 + 29, gpu="2.1", op="lend")
        store.append(LogKind.GPU, "j1", now=T0 + 29.5, gpu="2.1", op="reclaim", proactive=True)
    finally:
        store.close()
    j1 = load_timeline(tmp_path)[0].jobs[0]
    assert (j1.reclaims, j1.ahead) == ((20.0, 29.5), (29.5,))


def test_requests_with_sent_at_are_placed_by_it(tmp_path: Path) -> None:
    csv_path = tmp_path / "r.csv"
    csv_path.write_text(
        "id,send_s,answer_s,status,latency_s,error,service,wait_s,exec_s,replica,prewarmed,sent_at\n"
        f"0,0.5,0.7,200,0.2,,echo,0.1,,2.0,0,{T0 + 12.5}\n"
        f"1,1.5,1.7,200,0.2,,echo,0.1,,2.0,1,{T0 + 13.6}\n"
    )
    _, rows = read_requests(csv_path)
    # The load's second 0 is the smallest sent_at - send_s: T0 + 12 (a late read adds).
    assert sent_offset(rows, T0) == pytest.approx(12.0)
    assert sent_offset([RequestRow(1.0, 0.4, 200)], T0) is None  # an older CSV


# -- the CLI and the picture ---------------------------------------------------------------

needs_matplotlib = pytest.mark.skipif(not matplotlib_available(), reason="matplotlib missing")


@needs_matplotlib
def test_cli_writes_a_png_and_prints_its_path(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_file = tmp_path / "requests.csv"
    csv_file.write_text(
        "id,send_s,answer_s,status,latency_s,error\n"
        "0,0.0,6.0,200,6.0,\n1,10.0,10.2,200,0.2,\n2,18.0,48.0,0,30.0,timeout\n"
    )
    out = tmp_path / "t.png"
    code, stdout, stderr = run_cli(
        capsys, "timeline", str(state), "--requests", str(csv_file), "--slo-wait", "0.5",
        "--out", str(out),
    )  # fmt: skip
    assert (code, stderr) == (0, "")
    assert stdout.strip() == str(out)
    assert out.read_bytes().startswith(PNG_MAGIC) and out.stat().st_size > 10_000
    code, stdout, _ = run_cli(capsys, "timeline", str(state), "--out", str(tmp_path / "u.png"))
    assert code == 0 and (tmp_path / "u.png").stat().st_size > 10_000


def test_cli_last_draws_the_end_of_the_log(
    state: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--last S: the S seconds before the log's newest entry (no controller runs
    here, so the picture does not run on to now)."""
    import deepboot.report.timeline_figure as tf

    drawn: dict[str, Any] = {}
    real = tf.timeline_figure

    def spy(timeline: Timeline, *args: Any, **kwargs: Any) -> bytes:
        drawn.update(kwargs, end=timeline.end)
        return real(timeline, *args, **kwargs)

    monkeypatch.setattr(tf, "timeline_figure", spy)
    out = tmp_path / "last.png"
    code, _, err = run_cli(capsys, "timeline", str(state), "--last", "20", "--out", str(out))
    assert (code, err) == (0, "")
    assert (drawn["end"], drawn["since"]) == (50.0, 30.0)
    assert drawn["title"].endswith("the last 20 s")
    assert out.read_bytes().startswith(PNG_MAGIC)
    code, _, _ = run_cli(
        capsys, "timeline", str(state), "--last", "20", "--title", "T", "--out", str(out)
    )
    assert code == 0 and drawn["title"] == "T"


def test_cli_names_the_directory_without_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "nothing"
    empty.mkdir()
    code, _, err = run_cli(capsys, "timeline", str(empty), "--out", str(tmp_path / "t.png"))
    assert code == 2
    assert_one_line_error(err, str(empty), "deepboot.db")
    assert not (tmp_path / "t.png").exists()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--slo-wait", "0"], ["--slo-wait"]),
        (["--load-offset", "3"], ["--load-offset", "--requests"]),
        (["--out", ""], ["--out"]),
        (["--last", "0"], ["--last"]),
        (["--last", "nan"], ["--last"]),
    ],
)
def test_cli_flag_errors(
    state: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: list[str]
) -> None:
    code, _, err = run_cli(capsys, "timeline", str(state), *flags)
    assert code == 2
    assert_one_line_error(err, *words)


def test_cli_refuses_to_write_into_the_state_dir(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "timeline", str(state), "--out", str(state / "t.png"))
    assert code == 2
    assert_one_line_error(err, "inside the input directory")


def test_cli_without_matplotlib_is_one_clear_line(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    code, _, err = run_cli(capsys, "timeline", str(state), "--out", str(tmp_path / "t.png"))
    assert code == 2
    assert_one_line_error(err, "matplotlib", "pip install")


def test_reconstruction_and_cli_do_not_import_matplotlib() -> None:
    code = (
        "import sys, deepboot.report.timeline, deepboot.cli.timeline, deepboot.cli.main\n"
        "sys.exit(1 if 'matplotlib' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
