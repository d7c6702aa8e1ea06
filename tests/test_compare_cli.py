"""End to end: ``deepboot compare`` on a tiny mixed workload, in-process."""

from __future__ import annotations

import base64
import contextlib
import csv
import dataclasses
import io
import json
import multiprocessing
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from deepboot import matrix as matrix_module
from deepboot.cli.compare import MatrixProgress
from deepboot.cli.main import main
from deepboot.matrix import (
    RunOutcome,
    RunTask,
    _execute_in_worker,
    execute,
    parse_run,
    run_matrix,
)
from deepboot.report.schema import SUMMARY_SCHEMA
from tests.cli_helpers import assert_one_line_error

REPO = Path(__file__).resolve().parents[1]
DEMO_24 = REPO / "examples" / "demo-24.csv"

HEADER = "name,time,application,num_replicas,batch_size,duration,num_task"

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_mixed_workload(path: Path) -> Path:
    """Two short training jobs and a burst of inference on two services."""
    rows = [
        HEADER,
        "cifar10-0,0,cifar10,2,128,-1,-1",
        "inference-ncf-1,5,infer-ncf-1,1,1,20.0,100",
        "ncf-1,30,ncf,1,32768,-1,-1",
        "inference-bert-2,90,infer-bert-1,1,1,30.0,50",
        "inference-ncf-3,200,infer-ncf-1,1,1,20.0,100",
        *(f"inference-bert-{i},{396 + i},infer-bert-1,1,1,30.0,50" for i in range(4, 8)),
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


RUNS = ("deepboot=deepboot", "pollux-only=pollux:no-lending", "limit=pollux:no-inference")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One compare run shared by the tests that only read its outputs."""
    tmp = tmp_path_factory.mktemp("compare")
    workload = make_mixed_workload(tmp / "tiny.csv")
    out = tmp / "out"
    argv = ["compare", "--workload", str(workload), "--cluster", "2x4", "--inference-nodes", "1"]
    for r in RUNS:
        argv += ["--run", r]
    argv += ["--out", str(out), "--procs", "1", "--quiet", "--baseline", "pollux-only"]
    # Module-scoped fixtures cannot use capsys; main() binds its consoles to the
    # current sys.stdout/sys.stderr, so redirecting them captures everything.
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    return {"code": code, "out": out, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


def test_compare_succeeds_and_prints_one_table(matrix: dict[str, Any]) -> None:
    assert matrix["code"] == 0, matrix["stderr"]
    text = matrix["stdout"]
    assert text.count("Comparison (3 runs; vs base: pollux-only)") == 1
    for name in ("deepboot", "pollux-only", "limit"):
        assert re.search(rf"│ tiny\s+│ {re.escape(name)}\s", text), name
    assert "…" not in text  # never squeezed into ellipses, even on an 80-column pipe
    # It fits the console (80 columns on a pipe) with the columns that matter most.
    table = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 80, text
    assert "SLO" in text and "vs base" in text


def test_results_csv_has_one_row_per_run(matrix: dict[str, Any]) -> None:
    rows = read_csv(matrix["out"] / "results.csv")
    assert [(r["workload"], r["run"]) for r in rows] == [
        ("tiny", "deepboot"),
        ("tiny", "pollux-only"),
        ("tiny", "limit"),
    ]
    assert rows[1]["spec"] == "pollux-only=pollux:no-lending"
    assert all(r["training.completed"] == "2" for r in rows)


def test_run_flags_reach_the_simulator(matrix: dict[str, Any]) -> None:
    by_run = {r["run"]: r for r in read_csv(matrix["out"] / "results.csv")}
    # no-lending: nothing lent, nothing reclaimed, inference still served.
    assert float(by_run["pollux-only"]["cluster.lent_gpu_s"]) == 0.0
    assert by_run["pollux-only"]["cluster.reclaims"] == "0"
    assert by_run["pollux-only"]["inference.completed"] == "7"
    # no-inference: every node trains and no inference task exists.
    assert by_run["limit"]["cluster.inference_nodes"] == "0"
    assert by_run["limit"]["inference.tasks"] == "0"
    # deepboot lends the idle inference GPUs.
    assert float(by_run["deepboot"]["cluster.lent_gpu_s"]) > 0.0


def test_summaries_hold_the_schema_and_the_run(matrix: dict[str, Any]) -> None:
    files = sorted(p.name for p in (matrix["out"] / "summaries").iterdir())
    assert files == ["tiny--deepboot.json", "tiny--limit.json", "tiny--pollux-only.json"]
    summary = json.loads((matrix["out"] / "summaries" / "tiny--deepboot.json").read_text())
    for key, sub in SUMMARY_SCHEMA.items():
        assert key in summary
        for s in sub or ():
            assert s in summary[key], (key, s)
    assert summary["run"] == {"name": "deepboot", "spec": "deepboot=deepboot"}
    assert summary["inference"]["tasks"] == 7


FIGURE_KINDS = ("jct-vs-slo", "gpus", "jct-cdf", "waits", "reclaims")
"""The figures of a workload with inference and two runs or more serving it, in order."""


def test_figures_are_written_and_embedded(matrix: dict[str, Any]) -> None:
    out = matrix["out"]
    pngs = {p: (out / f"{p}-tiny.png").read_bytes() for p in FIGURE_KINDS}
    assert all(b.startswith(PNG_MAGIC) for b in pngs.values())
    html = (out / "report.html").read_text(encoding="utf-8")
    embedded = [base64.b64decode(s) for s in re.findall(r"base64,([^\"]+)\"", html)]
    assert embedded == list(pngs.values())
    for kind in FIGURE_KINDS:  # each with its section, for the page's links
        assert f'<h2 id="{kind}-tiny">' in html and f'href="#{kind}-tiny"' in html
    assert "deepboot compare --workload" in html and "--baseline pollux-only" in html
    assert "AFE restarts" in html and "no lending" in html  # runs with defaults spelled out


@pytest.mark.parametrize(
    ("runs", "extra", "message"),
    [
        (("x=nosuchpolicy",), (), "nosuchpolicy"),
        (("a=pollux", "a=deepboot"), (), "two runs are named 'a'"),
        (("a=pollux",), ("--baseline", "b"), "--baseline 'b' is not a run name"),
        (("a=deepboot:ats-i=nope",), (), "nope"),
        (("a=pollux:bogus_param=1",), (), "bogus_param"),
        (("a=pollux:no-lendig",), (), "unknown flag"),
        (("a=pollux",), ("--procs", "0"), "--procs must be >= 1"),
        (("a=pollux",), ("--cluster", "2x4", "--inference-nodes", "2"), "--inference-nodes 2"),
    ],
    ids=[
        "unknown-policy", "duplicate-name", "bad-baseline", "unknown-ats-i", "bad-param",
        "bad-flag", "zero-procs", "no-training-pool",
    ],
)  # fmt: skip
def test_bad_settings_fail_before_any_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    runs: tuple[str, ...],
    extra: tuple[str, ...],
    message: str,
) -> None:
    workload = make_mixed_workload(tmp_path / "tiny.csv")
    argv = ["compare", "--workload", str(workload), "--cluster", "2x4", "--inference-nodes", "1"]
    for r in runs:
        argv += ["--run", r]
    argv += ["--out", str(tmp_path / "out"), "--quiet", *extra]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert not (tmp_path / "out").exists()  # nothing was run or written


def test_workloads_with_the_same_name_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = make_mixed_workload(tmp_path / "a" / "w.csv")
    two = make_mixed_workload(tmp_path / "b" / "w.csv")
    code = main(
        ["compare", "--workload", str(one), "--workload", str(two), "--out", str(tmp_path / "o")]
    )
    assert code == 2
    assert "share the name 'w'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("inference", "runs", "kinds"),
    [
        (True, ("p=pollux:no-lending",), FIGURE_KINDS[1:]),
        (False, ("p=pollux:no-lending", "d=deepboot"), ("gpus", "jct-cdf", "reclaims")),
    ],
    ids=["one-run-no-scatter", "no-inference-no-waits"],
)
def test_inference_figures_only_where_there_is_something_to_show(
    tmp_path: Path, inference: bool, runs: tuple[str, ...], kinds: tuple[str, ...]
) -> None:
    workload = tmp_path / "w.csv"
    if inference:
        make_mixed_workload(workload)
    else:
        workload.write_text(f"{HEADER}\nncf-0,0,ncf,1,32768,-1,-1\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    # An earlier run's figures of this workload: those this run does not draw go.
    for k in FIGURE_KINDS:
        (out / f"{k}-w.png").write_bytes(b"stale")
    (out / "gpus-other.png").write_bytes(b"another workload's")
    argv = ["compare", "--workload", str(workload), "--cluster", "2x4", "--inference-nodes", "1"]
    for r in runs:
        argv += ["--run", r]
    assert main([*argv, "--procs", "1", "--quiet", "--out", str(out)]) == 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted([*(f"{k}-w.png" for k in kinds), "gpus-other.png"])
    assert all((out / f"{k}-w.png").read_bytes() != b"stale" for k in kinds)
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.count("<img") == len(kinds)


def test_missing_matplotlib_is_reported_and_no_figures_still_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if not installed
    workload = make_mixed_workload(tmp_path / "tiny.csv")
    argv = ["compare", "--workload", str(workload), "--cluster", "2x4", "--inference-nodes", "1"]
    argv += ["--run", "p=pollux:no-lending", "--out", str(tmp_path / "out"), "--quiet"]
    assert main(argv) == 2
    assert "pip install 'matplotlib" in capsys.readouterr().err
    assert main([*argv, "--no-figures"]) == 0
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "<img" not in html and "<table" in html
    assert not list((tmp_path / "out").glob("*.png"))


def test_a_failing_run_is_reported_not_raised(tmp_path: Path) -> None:
    task = RunTask(
        index=3,
        workload_path=str(tmp_path / "missing.csv"),
        workload_name="missing",
        run=parse_run("a=pollux"),
        cluster="2x4",
        inference_nodes=1,
        profiles=None,
        interval=60.0,
        seed=0,
    )
    outcome = execute(task)
    assert outcome.index == 3
    assert outcome.error is not None and "missing.csv" in outcome.error
    assert outcome.summary == {}


def make_tasks(tmp_path: Path) -> list[RunTask]:
    workload = make_mixed_workload(tmp_path / "tiny.csv")
    runs = [parse_run("deepboot"), parse_run("p=pollux:no-lending")]
    return [
        RunTask(
            index=i,
            workload_path=str(workload),
            workload_name="tiny",
            run=run,
            cluster="2x4",
            inference_nodes=1,
            profiles=None,
            interval=60.0,
            seed=0,
        )
        for i, run in enumerate(runs)
    ]


def comparable(outcome: RunOutcome) -> tuple[Any, ...]:
    """Everything of an outcome except wall-clock measurements."""
    summary = {k: v for k, v in outcome.summary.items() if k not in ("wall_s", "scheduler")}
    assert outcome.usage is not None and outcome.waits is not None
    return (
        outcome.index,
        summary,
        outcome.jcts,
        outcome.reclaim_times,
        outcome.usage.edges.tolist(),
        outcome.usage.values.tolist(),
        dataclasses.replace(outcome.waits, waits=None, longer=None),
        outcome.waits.waits.tolist(),
        outcome.waits.longer.tolist(),
    )


def test_an_outcome_carries_its_request_waits_reduced(tmp_path: Path) -> None:
    for task in make_tasks(tmp_path):
        outcome = execute(task)
        waits, inference = outcome.waits, outcome.summary["inference"]
        assert waits is not None and waits.label == task.run.name
        assert waits.requests == inference["tasks"] == 7
        assert waits.unstarted == inference["requests_unstarted"]
        assert waits.attainment == pytest.approx(inference["slo_attainment"])
        assert dict(waits.slo_wait_s) == {
            name: s["slo_wait_s"] for name, s in inference["per_service"].items()
        }
        assert 0 < waits.waits.size <= 500
        # Past the longest wait, only the requests that never started are left.
        assert waits.longer[-1] == pytest.approx(waits.unstarted / waits.requests)


def test_worker_processes_give_the_in_process_results(tmp_path: Path) -> None:
    tasks = make_tasks(tmp_path)
    quiet = Console(file=io.StringIO())
    with MatrixProgress(quiet, tasks, enabled=False) as display:
        serial = run_matrix(tasks, 1, display)
    with MatrixProgress(quiet, tasks, enabled=False) as display:
        parallel = run_matrix(tasks, 2, display)
    assert [o.error for o in parallel] == [None, None]
    assert [comparable(o) for o in parallel] == [comparable(o) for o in serial]


def test_progress_display_shows_running_cells(tmp_path: Path) -> None:
    tasks = make_tasks(tmp_path)
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with MatrixProgress(console, tasks, enabled=True) as display:
        display.update(1, 3723.0, 1, 2)
        display.finished(0)
    text = buf.getvalue()
    assert "p / tiny" in text
    assert "01:02:03" in text
    assert "runs" in text


def test_worker_progress_goes_through_a_manager_queue(tmp_path: Path) -> None:
    task = make_tasks(tmp_path)[1]
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        queue = manager.Queue()
        outcome = _execute_in_worker(task, queue)
        messages = []
        while not queue.empty():
            messages.append(queue.get_nowait())
    assert outcome.error is None
    assert messages, "a run reports its progress at least once"
    assert all(m[0] == task.index for m in messages)
    assert messages[-1][2:] == (2, 2)  # the last report: every job completed


# ------------------------------------------------------------------ issue 18, point 5

SMALL_SWEEP = (
    *("--cluster", "4x4", "--inference-nodes", "1", "--run", "fifo", "--run", "tiresias"),
    *("--max-time", "7200", "--no-figures", "--quiet"),
)


def result_rows(out: Path) -> list[dict[str, str]]:
    """results.csv without the workload's name and the wall-clock measurements."""
    varying = ("workload", "wall_s", "scheduler.decision_ms_median", "scheduler.decision_ms_max")
    rows = read_csv(out / "results.csv")
    for row in rows:
        for key in varying:
            row.pop(key)
    return rows


def compare_from_a_pipe(workload: Path, out: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``deepboot compare --workload /dev/fd/N ARGV --out OUT`` in a new process, the
    workload's bytes coming through a pipe (as from ``<(cat WORKLOAD)``)."""
    read, write = os.pipe()
    try:
        with os.fdopen(write, "wb") as f:
            f.write(workload.read_bytes())  # a small file: the pipe's buffer holds it
        return subprocess.run(
            [sys.executable, "-m", "deepboot.cli.main", "compare", "--workload", f"/dev/fd/{read}"]
            + [*argv, "--out", str(out)],
            pass_fds=(read,),
            capture_output=True,
            text=True,
            timeout=600,  # only against a hang
            cwd=REPO,
        )
    finally:
        os.close(read)


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd")
@pytest.mark.parametrize("procs", ["1", "2"])
def test_a_workload_from_a_pipe_gives_the_files_results(tmp_path: Path, procs: str) -> None:
    from_file = tmp_path / "file"
    argv = [*SMALL_SWEEP, "--procs", procs]
    assert main(["compare", "--workload", str(DEMO_24), *argv, "--out", str(from_file)]) == 0
    proc = compare_from_a_pipe(DEMO_24, tmp_path / "pipe", *argv)
    assert proc.returncode == 0, proc.stderr
    assert len(result_rows(from_file)) == 2
    assert result_rows(tmp_path / "pipe") == result_rows(from_file)


def test_a_sweep_whose_every_run_fails_writes_no_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # demo-24's first job asks for 12 GPUs; FIFO and Tiresias run a job on the GPUs it
    # asks for, and without lending training has 4: every run fails.
    out = tmp_path / "out"
    argv = ["compare", "--workload", str(DEMO_24), "--cluster", "2x4", "--inference-nodes", "1"]
    argv += ["--run", "a=fifo:no-lending", "--run", "b=tiresias:no-lending"]
    argv += ["--procs", "1", "--no-figures", "--quiet", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "run a on demo-24: job 'cifar10-0' can never run" in err
    assert err.splitlines()[-1] == f"deepboot: error: all 2 runs failed; nothing written to {out}"
    assert not out.exists()
    # A previous sweep's results are left as they were, not overwritten with empty ones.
    out.mkdir()
    for name in ("report.html", "results.csv"):
        (out / name).write_text("previous", encoding="utf-8")
    assert main(argv) == 2
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "results.csv"]
    assert {(out / n).read_text(encoding="utf-8") for n in ("report.html", "results.csv")} == {
        "previous"
    }


def _die(task: RunTask, queue: Any) -> RunOutcome:
    """A worker that ends abruptly (as one killed for memory would)."""
    os._exit(3)


def test_a_sweep_that_cannot_run_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(matrix_module, "_execute_in_worker", _die)
    out = tmp_path / "out"
    argv = ["compare", "--workload", str(DEMO_24), *SMALL_SWEEP, "--procs", "2"]
    assert main([*argv, "--out", str(out)]) == 2
    assert_one_line_error(capsys.readouterr().err, "the run matrix could not run", "worker")
    assert not out.exists()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends


@pytest.mark.parametrize(
    ("address", "words"),
    [
        (f"127.0.0.1:{_closed_port()}", ("cannot reach the Ray cluster", "within 10 s")),
        ("not-an-address", ("HOST:PORT",)),
    ],
    ids=["nothing-listens", "malformed"],
)
def test_compare_on_an_unreachable_ray_address_ends_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], address: str, words: tuple[str, ...]
) -> None:
    """``ray.init`` retries an address where nothing listens for minutes: the sweep
    checks it first (bounded) and stops with one line, writing nothing."""
    out = tmp_path / "out"
    argv = ["compare", "--workload", str(DEMO_24), "--cluster", "4x4", "--inference-nodes", "1"]
    argv += ["--run", "p=pollux"]
    argv += ["--ray", address, "--no-figures", "--quiet", "--out", str(out)]
    assert main(argv) == 2
    assert_one_line_error(capsys.readouterr().err, *words)
    assert not out.exists()


# ------------------------------------------------------------------ the demo's report


def demo_argv() -> list[str]:
    """The arguments of the ``deepboot compare`` that ``make demo`` runs, read from the
    Makefile (its ``DEMO_*`` variables substituted), so the test follows the demo."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    variables = dict(re.findall(r"^(DEMO_\w+)\s*:=\s*(\S+)\s*$", text, re.MULTILINE))
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert recipe is not None, "no demo target in the Makefile"
    lines = recipe.group(1).replace("\\\n", " ").splitlines()
    command = next(line for line in lines if "deepboot compare" in line)
    command = re.sub(r"\$\((DEMO_\w+)\)", lambda m: variables[m.group(1)], command)
    words = shlex.split(command)
    return words[words.index("compare") :]


def test_the_demo_report_shows_gpus_waits_and_the_scatter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = demo_argv()
    assert "--no-figures" not in argv  # the demo's report has its figures
    out = tmp_path / "demo"
    argv[argv.index("--out") + 1] = str(out)
    monkeypatch.chdir(REPO)  # the Makefile's paths are the repository's
    assert main([*argv, "--procs", "1", "--quiet"]) == 0
    html = (out / "report.html").read_text(encoding="utf-8")
    for kind in ("gpus", "waits", "jct-vs-slo"):
        png = (out / f"{kind}-demo-deepboot.png").read_bytes()
        assert png.startswith(PNG_MAGIC)
        assert f'<h2 id="{kind}-demo-deepboot">' in html
        assert base64.b64encode(png).decode("ascii") in html
    assert "GPUs over time: demo-deepboot" in html
    assert "Inference waits against the SLO: demo-deepboot" in html
    assert "JCT against SLO attainment: demo-deepboot" in html
    assert "SLO target every service shares (99%)" in html
