"""Every command in README.md and docs/*.md runs as written (issue 44).

Each command block (:mod:`tests.docs_blocks`) runs with ``bash -e`` in a copy of the
repository's tracked files, with ``../shared`` beside it (a link to the real one) and
``.venv`` a link to the installed one, so that ``deepboot``, ``.venv/bin/deepboot``
and the relative paths mean what they mean to a reader in a fresh clone; the blocks
of a file run in its order in one copy (a block may read what an earlier one wrote,
as a reader's would). ``make`` runs against the installed virtualenv and never
reinstalls it. A block fails the test on any non-zero exit, with its output.

Blocks marked ``slow`` run in ``make test-slow``; blocks marked ``skip`` are counted
with their reasons. The session's summary prints the counts
(:func:`count_line`, via ``tests/conftest.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs_blocks import Block, all_blocks

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
BLOCKS = all_blocks(REPO)
BLOCK_TIMEOUT_S = 900


def count_line() -> str:
    """``docs blocks: 9 run (8 fast, 1 slow), 14 skipped with a reason``."""
    run = [b for b in BLOCKS if b.mode != "skip"]
    slow = sum(b.mode == "slow" for b in run)
    skipped = len(BLOCKS) - len(run)
    return (
        f"docs command blocks: {len(run)} run ({len(run) - slow} in make test, {slow} in "
        f"make test-slow), {skipped} not run, each with its stated reason"
    )


def _tracked(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True, timeout=60
    ).stdout
    return [p for p in out.decode().split("\0") if p]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh clone's view: the tracked files, ``../shared`` and ``.venv`` beside."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent: the docs' commands read the shared traces")
    top = tmp_path_factory.mktemp("docs")
    tree = top / "repo"
    for rel in _tracked(REPO):
        src = REPO / rel
        if src.is_file():
            dst = tree / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    (top / "shared").symlink_to(SHARED)
    (tree / ".venv").symlink_to(Path(sys.executable).parent.parent)
    yield tree


def _env(tree: Path) -> dict[str, str]:
    venv_bin = Path(sys.executable).parent
    env = dict(os.environ)
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "100"
    env.pop("PYTHONPATH", None)
    # make runs against the installed virtualenv: its install stamps count as new, so
    # a recipe never reinstalls it (the copy's pyproject.toml must not repoint it).
    stamps = " ".join(f"-o {venv_bin.parent}/{s}" for s in (".installed", ".installed-test"))
    env["MAKEFLAGS"] = f"{stamps} VENV={venv_bin.parent}"
    return env


def _run(block: Block, tree: Path) -> None:
    proc = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block.text],
        cwd=tree,
        env=_env(tree),
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        pytest.fail(f"{block.ident}: exit {proc.returncode}\n{block.text}\n--- output ---\n{tail}")


def _params(mode: str) -> list[object]:
    return [pytest.param(b, id=b.ident) for b in BLOCKS if b.mode == mode]


@pytest.mark.parametrize("block", _params("run"))
def test_a_docs_block_runs_as_written(block: Block, clone: Path) -> None:
    _run(block, clone)


@pytest.mark.slow
@pytest.mark.parametrize("block", _params("slow"))
def test_a_slow_docs_block_runs_as_written(block: Block, clone: Path) -> None:
    _run(block, clone)


def test_every_docs_command_block_runs_or_says_why_not() -> None:
    """The count the session prints, and no block left without a decision."""
    assert BLOCKS, "no command block found in README.md and docs/*.md"
    for b in BLOCKS:
        assert b.mode in ("run", "slow", "skip"), b
        assert b.mode != "skip" or b.reason, b
    assert any(b.path == "README.md" and b.mode == "run" for b in BLOCKS)
