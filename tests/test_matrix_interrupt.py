"""Ctrl-C during a sweep keeps the runs that finished (process pool and CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepboot.cli import compare as compare_cli
from deepboot.cli.main import main
from deepboot.matrix import INTERRUPTED, MatrixInterrupted, RunTask, parse_run, run_matrix

REPO = Path(__file__).resolve().parents[1]
DEMO = str(REPO / "examples" / "demo-deepboot.csv")


class _CtrlCAfterFirst:
    """A progress observer whose user presses Ctrl-C when the first run ends."""

    def update(self, index: int, now: float, completed: int, total: int) -> None:
        pass

    def finished(self, index: int) -> None:
        raise KeyboardInterrupt


def _task(index: int, run: str, max_time: float) -> RunTask:
    return RunTask(
        index=index,
        workload_path=DEMO,
        workload_name="demo",
        run=parse_run(run),
        cluster="4x4",
        inference_nodes=2,
        profiles=None,
        interval=60.0,
        seed=0,
        max_time=max_time,
    )


def test_interrupted_pool_returns_the_finished_run() -> None:
    tasks = [_task(0, "fifo", 600.0), _task(1, "deepboot", 10 * 3600.0)]
    with pytest.raises(MatrixInterrupted) as info:
        run_matrix(tasks, 2, _CtrlCAfterFirst())
    first, second = info.value.outcomes
    assert first.error is None and first.summary  # the short run finished first
    assert second.error == INTERRUPTED
    assert "1 of 2 runs had finished" in str(info.value)


def test_interrupted_compare_writes_the_finished_runs_and_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(compare_cli.MatrixProgress, "finished", _CtrlCAfterFirst.finished)
    out = tmp_path / "out"
    code = main(
        [
            "compare",
            "--workload",
            DEMO,
            "--cluster",
            "4x4",
            "--inference-nodes",
            "2",
            "--run",
            "fifo",
            "--run",
            "deepboot",
            "--procs",
            "1",
            "--max-time",
            "600",
            "--out",
            str(out),
            "--no-figures",
        ]
    )
    assert code == 130
    assert [p.name for p in (out / "summaries").glob("*.json")] == ["demo-deepboot--fifo.json"]
    assert "fifo" in (out / "results.csv").read_text()
    assert "interrupted: 1 of 2 runs had finished" in capsys.readouterr().err


def test_compare_interrupted_before_any_run_finished_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def ctrl_c(self: object, index: int, now: float, completed: int, total: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(compare_cli.MatrixProgress, "update", ctrl_c)
    out = tmp_path / "out"
    argv = ["compare", "--workload", DEMO, "--cluster", "4x4", "--inference-nodes", "2"]
    argv += ["--run", "fifo", "--procs", "1", "--max-time", "600", "--no-figures"]
    assert main([*argv, "--out", str(out)]) == 130
    assert not out.exists()
    err = capsys.readouterr().err
    assert f"interrupted: 0 of 1 runs had finished; nothing written to {out}" in err
