"""Issue 42, finding 1: a state directory another user prepared must never hand them
the token (and with it code execution as whoever runs ``deepboot up``).

A second user is real here: where the tests run as root, ``setpriv`` drops to uid
65534 (``nobody``) to prepare the directory in the sticky system temporary directory,
as an attacker on the same machine would. ``deepboot up`` must refuse such a
directory, a symlinked one, token files it did not create, and a path inside a git
work tree that git does not ignore, each with one line, before it starts anything;
and by default it keeps its state outside the working directory.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deepboot.world.presets import GUARDED

pytestmark = pytest.mark.runtime

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]
SMALLEST = ("--training-nodes", "1", "--inference-nodes", "0", "--gpus-per-node", "1")
FAST = ("--interval", "2", "--poll", "0.3", "--http-port", "0")

as_second_user = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="acting as a second user (uid 65534) needs root and setpriv",
)


def deepboot(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``deepboot ARGS`` in ``cwd`` (the repository on sys.path), bounded."""
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "deepboot.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=full,
    )


def up_refused(state: Path, cwd: Path, *words: str) -> str:
    """Run ``deepboot up --state-dir state``; it must be refused with one line naming
    ``words``, having started nothing. Returns that line. Should it start a cluster
    (the old code did), the cluster is stopped before the assertion fails."""
    proc = deepboot("up", "--state-dir", str(state), *SMALLEST, *FAST, cwd=cwd)
    if proc.returncode == 0:
        deepboot("down", "--state-dir", str(state), cwd=cwd)
    assert proc.returncode != 0, f"'up' was not refused:\n{proc.stdout}\n{proc.stderr}"
    line = proc.stderr.strip()
    assert line and "\n" not in line, proc.stderr
    for word in words:
        assert word in line, (word, line)
    return line


def snapshot(d: Path) -> dict[str, tuple[int, int, bytes]]:
    """Each entry's (mode, owner, content) under ``d`` (not following symlinks)."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        body = p.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        out[str(p.relative_to(d))] = (st.st_mode, st.st_uid, body)
    st = d.lstat()
    out["."] = (st.st_mode, st.st_uid, b"")
    return out


def run_as_nobody(*argv: str) -> None:
    subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        check=True,
        timeout=30,
    )


@pytest.fixture
def planted() -> Iterator[Path]:
    """A state directory that user 65534 prepared in /tmp (mode 0777), holding an
    ``http-token`` and a ``ray-token`` of its choosing."""
    d = Path("/tmp") / f"deepboot-planted-{secrets.token_hex(6)}"
    run_as_nobody(
        "sh",
        "-c",
        f"umask 0 && mkdir -m 0777 {d} && printf %s {'a' * 64} > {d}/http-token "
        f"&& printf %s {'b' * 64} > {d}/ray-token",
    )
    assert d.lstat().st_uid == NOBODY
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@as_second_user
def test_a_state_dir_another_user_prepared_is_refused_and_nothing_is_read(
    planted: Path, tmp_path: Path
) -> None:
    before = snapshot(planted)
    up_refused(planted, tmp_path, str(planted), "nobody")
    # Untouched: not chmodded, no token rewritten or added, no cluster recorded.
    assert snapshot(planted) == before


def test_a_symlinked_state_dir_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    up_refused(link, tmp_path, str(link), "symlink")
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("planting", ["another owner", "mode 0644", "a symlink"])
def test_a_token_file_we_did_not_create_is_refused_never_reused(
    tmp_path: Path, planting: str
) -> None:
    if planting == "another owner" and os.geteuid() != 0:
        pytest.skip("giving a file to another owner needs root")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    token = state / "http-token"
    if planting == "a symlink":
        target = tmp_path / "elsewhere"
        target.write_text("c" * 64)
        token.symlink_to(target)
    else:
        token.write_text("c" * 64)
        os.chmod(token, 0o644 if planting == "mode 0644" else 0o600)
        if planting == "another owner":
            os.chown(token, NOBODY, NOBODY)
    before = snapshot(state)
    up_refused(state, tmp_path, str(token))
    assert snapshot(state) == before


def test_up_refuses_to_write_tokens_in_a_git_work_tree_at_an_unignored_path(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    subprocess.run(["git", "init", "-q", str(tree)], check=True, timeout=30)
    up_refused(tree / "state", tree, "git")
    assert not (tree / "state" / "http-token").exists()


def test_by_default_the_state_lives_outside_the_working_directory(tmp_path: Path) -> None:
    """``deepboot up`` with no --state-dir (and no --policy), run in a git work tree:
    tokens 0600 in a 0700 directory under $XDG_STATE_HOME, nothing written in the
    tree; ``status`` names the configuration it runs."""
    tree = tmp_path / "tree"
    tree.mkdir()
    subprocess.run(["git", "init", "-q", str(tree)], check=True, timeout=30)
    xdg = tmp_path / "xdg"
    env = {"XDG_STATE_HOME": str(xdg)}
    proc = deepboot("up", *SMALLEST, *FAST, cwd=tree, env=env)
    try:
        assert proc.returncode == 0, proc.stderr
        state = xdg / "deepboot" / "default"
        assert stat.S_IMODE(state.lstat().st_mode) == 0o700
        for name in ("http-token", "ray-token", "http-header"):
            st = (state / name).lstat()
            assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, name
            assert st.st_uid == os.geteuid()
        assert str(state) in "".join(proc.stdout.split())  # rich wraps long lines
        # No --policy: it runs the preset guarded, and status names it with its parts
        # (--interval 2 is the test's own, given beside it).
        shown = deepboot("status", cwd=tree, env=env)
        assert shown.returncode == 0, shown.stderr
        parts = GUARDED.parts().replace("--interval 30", "--interval 2")
        named = f"configuration: guarded = {parts}"
        # rich wraps long lines
        assert "".join(named.split()) in "".join(shown.stdout.split()), shown.stdout
        assert sorted(p.name for p in tree.iterdir()) == [".git"]
    finally:
        down = deepboot("down", cwd=tree, env=env)
        assert down.returncode == 0, down.stderr
