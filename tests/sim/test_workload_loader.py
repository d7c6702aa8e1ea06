"""Workload CSV loader: formats, sorting, and every InputError case."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepboot.core.errors import InputError
from deepboot.core.jobs import InferenceTaskSpec, TrainingJobSpec
from deepboot.core.params import BatchLimits
from deepboot.sim.workload import (
    DEEPBOOT_COLUMNS,
    POLLUX_COLUMNS,
    PURE_TRAIN_COLUMNS,
    load_workload,
)

APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
POLLUX_HEADER = ",".join(POLLUX_COLUMNS)
DEEPBOOT_HEADER = ",".join(DEEPBOOT_COLUMNS)


def make_csv(tmp_path: Path, *lines: str, name: str = "w.csv") -> Path:
    """Write ``lines`` (header included) as a CSV file and return its path."""
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_pollux_format_loads_and_sorts_stably(tmp_path: Path) -> None:
    path = make_csv(
        tmp_path,
        POLLUX_HEADER,
        "b,20,cifar10,6,2048",
        "a,10,ncf,1,32768",
        "c,20,bert,8,384",
        "d,10.5,yolov3,4,64",
    )
    w = load_workload(path, APPS)
    assert w.name == "w"
    assert w.inference == ()
    assert [j.name for j in w.training] == ["a", "d", "b", "c"]
    assert w.training[0] == TrainingJobSpec("a", 10.0, "ncf", 1, 32768)
    assert w.training[1].submit_time == 10.5


def test_deepboot_format_splits_inference(tmp_path: Path) -> None:
    path = make_csv(
        tmp_path,
        DEEPBOOT_HEADER,
        "cifar10-0,107,cifar10,6,2048,4.0,-1",
        "inference-bert-1,19,infer-bert-2,1,1,7.0,530",
        "inference-ncf-2,3,infer-ncf-1,1,1,2.5,3271",
    )
    w = load_workload(path, APPS)
    assert w.training == (TrainingJobSpec("cifar10-0", 107.0, "cifar10", 6, 2048),)
    assert w.inference == (
        InferenceTaskSpec("inference-ncf-2", 3.0, "infer-ncf-1", "ncf", 2.5, 3271),
        InferenceTaskSpec("inference-bert-1", 19.0, "infer-bert-2", "bert", 7.0, 530),
    )


def test_pure_train_header_ignores_duration(tmp_path: Path) -> None:
    path = make_csv(tmp_path, ",".join(PURE_TRAIN_COLUMNS), "j,1,ncf,1,32768,-1.0")
    assert load_workload(path, APPS).training == (TrainingJobSpec("j", 1.0, "ncf", 1, 32768),)


def test_blank_lines_and_bom_are_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_text("\ufeff" + POLLUX_HEADER + "\n\nj,1,ncf,1,32768\n\n", encoding="utf-8")
    assert [j.name for j in load_workload(path, APPS).training] == ["j"]


# (case id, lines after the header, expected line, expected field, words in message)
ROW_ERRORS = [
    ("too-few-columns", ["a,1,ncf,1,32768", "b,2,ncf,1"], 3, "batch_size", "4 values"),
    ("too-many-columns", ["a,1,ncf,1,32768,9"], 2, "batch_size", "6 values"),
    ("non-numeric-time", ["a,soon,ncf,1,32768"], 2, "time", "not a number"),
    ("negative-time", ["a,1,ncf,1,32768", "b,-5,ncf,1,32768"], 3, "time", "non-negative"),
    ("infinite-time", ["a,inf,ncf,1,32768"], 2, "time", "finite"),
    ("empty-time", ["a,,ncf,1,32768"], 2, "time", "empty"),
    ("zero-replicas", ["a,1,ncf,0,32768"], 2, "num_replicas", "positive"),
    ("float-replicas", ["a,1,ncf,1.5,32768"], 2, "num_replicas", "not an integer"),
    ("negative-batch", ["a,1,ncf,1,-2"], 2, "batch_size", "positive"),
    ("unknown-model", ["a,1,resnet,1,32"], 2, "application", "unknown model 'resnet'"),
    ("inference-row-in-pollux", ["a,1,infer-ncf-1,1,1"], 2, "application", "duration"),
    ("duplicate-name", ["a,1,ncf,1,32768", "a,2,ncf,1,32768"], 3, "name", "duplicate"),
    ("empty-name", [",1,ncf,1,32768"], 2, "name", "empty"),
]


@pytest.mark.parametrize(
    ("rows", "line", "field", "words"),
    [case[1:] for case in ROW_ERRORS],
    ids=[case[0] for case in ROW_ERRORS],
)
def test_bad_row_names_file_line_and_field(
    tmp_path: Path, rows: list[str], line: int, field: str, words: str
) -> None:
    path = make_csv(tmp_path, POLLUX_HEADER, *rows)
    with pytest.raises(InputError) as info:
        load_workload(path, APPS)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert words in err.message
    assert f"{path}:{line}" in str(err) and f"'{field}'" in str(err)


def test_unknown_model_lists_known_models(tmp_path: Path) -> None:
    path = make_csv(tmp_path, POLLUX_HEADER, "a,1,resnet,1,32")
    with pytest.raises(InputError, match="known models: bert, cifar10, deepspeech2"):
        load_workload(path, APPS)


DEEPBOOT_ROW_ERRORS = [
    ("unknown-inference-model", "i,1,infer-gpt-1,1,1,7.0,5", "application", "'gpt'"),
    ("zero-duration", "i,1,infer-ncf-1,1,1,0,5", "duration", "positive"),
    ("bad-num-task", "i,1,infer-ncf-1,1,1,7.0,many", "num_task", "not a number"),
    ("fractional-num-task", "i,1,infer-ncf-1,1,1,7.0,2.5", "num_task", "whole"),
    ("two-replicas", "i,1,infer-ncf-1,2,1,7.0,5", "num_replicas", "must be 1"),
    ("batch-of-64", "i,1,infer-ncf-1,1,64,7.0,5", "batch_size", "must be 1"),
    ("duration-of-ages", "i,1,infer-ncf-1,1,1,1e12,5", "duration", "exceeds the limit"),
    ("time-of-ages", "i,1e18,infer-ncf-1,1,1,7.0,5", "time", "exceeds the limit"),
]


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [case[1:] for case in DEEPBOOT_ROW_ERRORS],
    ids=[case[0] for case in DEEPBOOT_ROW_ERRORS],
)
def test_bad_inference_row(tmp_path: Path, row: str, field: str, words: str) -> None:
    path = make_csv(tmp_path, DEEPBOOT_HEADER, "t,1,ncf,1,32768,4.0,-1", row)
    with pytest.raises(InputError) as info:
        load_workload(path, APPS)
    assert (info.value.line, info.value.field) == (3, field)
    assert words in info.value.message


FILE_ERRORS = [
    ("empty-file", [], 1, "header", "empty"),
    ("blank-lines-only", ["", "  "], 1, "header", "empty"),
    ("header-only", [POLLUX_HEADER], 1, "header", "no rows"),
    (
        "unknown-header",
        ["name,time,app,num_replicas,batch_size", "a,1,ncf,1,1"],
        1,
        "app",
        "header",
    ),
]


@pytest.mark.parametrize(
    ("lines", "line", "field", "words"),
    [case[1:] for case in FILE_ERRORS],
    ids=[case[0] for case in FILE_ERRORS],
)
def test_bad_file(tmp_path: Path, lines: list[str], line: int, field: str, words: str) -> None:
    path = make_csv(tmp_path, *lines)
    with pytest.raises(InputError) as info:
        load_workload(path, APPS)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), line, field)
    assert words in info.value.message
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.csv"
    with pytest.raises(InputError) as info:
        load_workload(path, APPS)
    assert (info.value.path, info.value.line) == (str(path), 0)
    assert str(info.value) == f"{path}: file not found"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="directory"):
        load_workload(tmp_path, APPS)


needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is absent")


def _reference_rows(path: Path) -> list[list[str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.split(",") for line in lines[1:] if line.strip()]


@needs_traces
@pytest.mark.parametrize("number", range(1, 9), ids=lambda n: f"workload-{n}")
def test_reference_pollux_workloads_round_trip(number: int) -> None:
    path = TRACES / "workloads" / "pollux" / f"workload-{number}.csv"
    w = load_workload(path, APPS)
    expected = sorted(
        (
            TrainingJobSpec(r[0], float(r[1]), r[2], int(r[3]), int(r[4]))
            for r in _reference_rows(path)
        ),
        key=lambda j: j.submit_time,
    )
    assert len(w.training) == 160
    assert list(w.training) == expected
    assert w.inference == ()


@needs_traces
@pytest.mark.parametrize(
    ("name", "inference"),
    [("pure_train.csv", 0), ("small.csv", 3200), ("middle.csv", 16000)],
    ids=["pure_train", "small", "middle"],
)
def test_reference_deepboot_workloads(name: str, inference: int) -> None:
    w = load_workload(TRACES / "workloads" / name, APPS)
    reference = load_workload(TRACES / "workloads" / "pollux" / "workload-1.csv", APPS)
    assert w.training == reference.training
    assert len(w.inference) == inference
    times = [t.submit_time for t in w.inference]
    assert times == sorted(times)
    assert all(t.service == f"infer-{t.model}-{t.service.rsplit('-', 1)[1]}" for t in w.inference)
    assert all(t.duration > 0 for t in w.inference)


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ("j,1,cifar10,1,99999", "batch_size", "exceeds cifar10's largest batch size 4096"),
        ("j,1,cifar10,5000,128", "num_replicas", "exceeds the limit of 4096"),
        ("j,2e9,cifar10,1,128", "time", "exceeds the limit"),
    ],
    ids=["batch-above-the-model", "replicas-beyond-any-cluster", "time-of-ages"],
)
def test_training_rows_are_bounded(tmp_path: Path, row: str, field: str, words: str) -> None:
    limits = {"cifar10": BatchLimits(128, 4096, 32, 1024)}
    path = make_csv(tmp_path, POLLUX_HEADER, row)
    with pytest.raises(InputError) as info:
        load_workload(path, APPS, limits)
    assert (info.value.line, info.value.field) == (2, field)
    assert words in info.value.message
    # Without limits the batch size is only checked for being positive.
    if field == "batch_size":
        assert load_workload(path, APPS).training[0].batch_size == 99999
