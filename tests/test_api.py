"""The Python API: the README's example runs as written, and agrees with the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import deepboot
from deepboot.cli.main import main
from deepboot.core import ConfigError

REPO = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README has no Python API example"
    return match.group(1)


def test_the_readme_example_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    exec(compile(readme_example(), "README.md", "exec"), {})  # noqa: S102 - our own README
    out = capsys.readouterr().out
    assert "deepboot cuts the average JCT by" in out
    assert "'name':" in out


def test_the_api_gives_the_cli_summary(tmp_path: Path) -> None:
    path = REPO / "examples" / "demo-24.csv"
    result = deepboot.simulate(deepboot.load_workload(path), deepboot.cluster("4x4"), "pollux")
    out = tmp_path / "s.json"
    argv = ["simulate", "--workload", str(path), "--policy", "pollux", "--cluster", "4x4"]
    assert main([*argv, "--quiet", "--summary-json", str(out)]) == 0
    cli = json.loads(out.read_text())
    for summary in (cli, result.summary):
        summary.pop("wall_s")
        summary["scheduler"].pop("decision_ms_median")
        summary["scheduler"].pop("decision_ms_max")
    assert result.summary == cli
    assert [j["name"] for j in result.jobs] == [
        j.name for j in deepboot.load_workload(path).training
    ]


def test_bad_arguments_are_config_errors() -> None:
    workload = deepboot.load_workload(REPO / "examples" / "demo-24.csv")
    with pytest.raises(ConfigError, match="seed"):
        deepboot.simulate(workload, deepboot.cluster("4x4"), "pollux", seed=-1)
    with pytest.raises(ConfigError, match="unknown"):
        deepboot.simulate(workload, deepboot.cluster("4x4"), "nonesuch")
    with pytest.raises(AttributeError):
        deepboot.nonesuch  # noqa: B018


def test_frames_need_pandas_or_say_so() -> None:
    result = deepboot.Result(summary={}, jobs=[{"name": "a", "jct": 1.0}], inference=[])
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install pandas"):
            result.jobs_frame()
    else:
        assert list(result.jobs_frame()["name"]) == ["a"]


def machine_free(summary: dict[str, object]) -> dict[str, object]:
    out = json.loads(json.dumps(summary))
    out.pop("wall_s", None)
    out["scheduler"].pop("decision_ms_median", None)
    out["scheduler"].pop("decision_ms_max", None)
    return out


def test_compare_runs_cells_as_if_alone() -> None:
    path = REPO / "examples" / "demo-24.csv"
    cells = deepboot.compare(
        [path], ["pollux", "fifo-x=fifo", "broken=pollux:p=1000"], cluster="4x4",
        inference_nodes=0, procs=2,
    )  # fmt: skip
    assert [(c.workload, c.run) for c in cells] == [
        ("demo-24", "pollux"),
        ("demo-24", "fifo-x"),
        ("demo-24", "broken"),
    ]
    alone = deepboot.simulate(deepboot.load_workload(path), deepboot.cluster("4x4"), "pollux")
    assert machine_free(cells[0].summary) == machine_free(alone.summary)
    assert cells[1].error is None and cells[1].summary["policy"] == "fifo"
    assert cells[2].error is not None and "p must be in" in cells[2].error


def test_compare_reads_a_piped_workload_once(tmp_path: Path) -> None:
    """A workload given as a pipe (what a shell's <(cat w.csv) passes) is read once, by
    the caller, and every run gets it: the same cells as from the file."""
    import os
    import threading

    path = REPO / "examples" / "demo-24.csv"
    read, write = os.pipe()
    feeder = threading.Thread(target=lambda: (os.write(write, path.read_bytes()), os.close(write)))
    feeder.start()
    try:
        piped = deepboot.compare(
            [f"/dev/fd/{read}"], ["pollux", "fifo"], cluster="4x4", inference_nodes=0, procs=2
        )
    finally:
        feeder.join(30)
        os.close(read)
    filed = deepboot.compare([path], ["pollux", "fifo"], cluster="4x4", inference_nodes=0, procs=2)
    assert [c.error for c in piped] == [None, None]
    for a, b in zip(piped, filed, strict=True):
        assert machine_free(a.summary) | {"workload": ""} == machine_free(b.summary) | {
            "workload": ""
        }
