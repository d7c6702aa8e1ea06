"""Helpers shared by the CLI tests (no tests here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from deepboot.cli.main import main

POLLUX_HEADER = "name,time,application,num_replicas,batch_size"
PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"


def write_state_dir(state: Path, info: dict[str, object], token: str) -> Path:
    """A state directory as a controller leaves it: the directory 0700, ``http.json``
    recording ``info`` and ``http-token`` holding ``token``, both 0600 (whatever the
    umask), so the ownership checks of ``StateDir`` accept it."""
    state.mkdir(mode=0o700, exist_ok=True)
    os.chmod(state, 0o700)
    for name, text in (("http.json", json.dumps(info)), ("http-token", token + "\n")):
        path = state / name
        path.write_text(text, encoding="utf-8")
        os.chmod(path, 0o600)
    return state


def make_workload(path: Path) -> Path:
    """One short training job: simulates in well under a second."""
    path.write_text(f"{POLLUX_HEADER}\nncf-0,0,ncf,1,32768\n", encoding="utf-8")
    return path


def make_philly(path: Path, jobs: int = 30) -> Path:
    """A small Philly-format trace of ``jobs`` rows."""
    rows = [
        f"2017-10-0{1 + i % 9} 03:{i % 60:02d}:{(7 * i) % 60:02d},{600 + i},"
        f"{1 + i % 4},{(0.3 + i % 5 * 20) * 3600:.1f},c{i % 3}"
        for i in range(jobs)
    ]
    path.write_text("\n".join([PHILLY_HEADER, *rows]) + "\n", encoding="utf-8")
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``deepboot ARGV`` in-process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(err: str, *words: str) -> None:
    """``err`` is the CLI's one error line, mentioning each of ``words``, no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("deepboot: error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], (word, lines[0])
