"""The state directory's ownership rules as pure functions of a (fake) ``lstat``
(issue 42, finding 1): whatever user runs the tests, every case is checked, and
each refusal is one line naming the path and its owner. The real second user is in
test_state_ownership.py."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from deepboot.runtime.store.ownership import (
    UnsafePathError,
    check_ancestors,
    check_own_dir,
    check_own_file,
    read_secret,
)
from deepboot.runtime.store.statedir import StateDir, check_not_committable, default_root, xdg_root

ME, OTHER, ROOT = 1000, 65534, 0


def st(kind: int, mode: int, uid: int) -> os.stat_result:
    return os.stat_result((kind | mode, 0, 0, 1, uid, uid, 0, 0, 0, 0))


DIR, REG, LNK = stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK


def fake(tree: dict[str, os.stat_result]) -> Callable[[str], os.stat_result]:
    def lstat(path: str) -> os.stat_result:
        try:
            return tree[path]
        except KeyError:
            raise FileNotFoundError(2, "No such file or directory", path) from None

    return lstat


SAFE_TOP = {"/": st(DIR, 0o755, ROOT), "/tmp": st(DIR, 0o1777, ROOT)}


def test_a_directory_of_ours_passes_and_a_missing_one_is_to_be_created() -> None:
    tree = {**SAFE_TOP, "/tmp/s": st(DIR, 0o700, ME)}
    assert check_own_dir("/tmp/s", ME, fake(tree))
    assert not check_own_dir("/tmp/t", ME, fake(tree))
    check_ancestors("/tmp/s/inner", ME, fake(tree))


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        (st(DIR, 0o700, OTHER), ["/tmp/s", "owned by", "uid 65534"]),
        (st(DIR, 0o777, ME), ["/tmp/s", "writable by other users", "0777"]),
        (st(DIR, 0o770, ME), ["/tmp/s", "writable by other users"]),
        (st(LNK, 0o777, ME), ["/tmp/s", "symlink"]),
        (st(REG, 0o600, ME), ["/tmp/s", "not a directory"]),
    ],
    ids=["another owner", "world-writable", "group-writable", "symlink", "a file"],
)
def test_a_state_directory_not_safely_ours_is_refused(
    entry: os.stat_result, words: list[str]
) -> None:
    with pytest.raises(UnsafePathError) as err:
        check_own_dir("/tmp/s", ME, fake({**SAFE_TOP, "/tmp/s": entry}))
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    ("tree", "bad"),
    [
        ({**SAFE_TOP, "/tmp/a": st(DIR, 0o755, OTHER)}, "/tmp/a"),  # made first by another
        ({**SAFE_TOP, "/tmp/a": st(DIR, 0o777, ME)}, "/tmp/a"),  # ours, but anyone may swap
        ({**SAFE_TOP, "/tmp/a": st(LNK, 0o777, OTHER)}, "/tmp/a"),  # another's symlink
        ({"/": st(DIR, 0o777, ROOT)}, "/"),
    ],
    ids=["another's parent in a sticky dir", "world-writable parent", "another's link", "root"],
)
def test_an_ancestor_another_user_can_change_is_refused(
    tree: dict[str, os.stat_result], bad: str
) -> None:
    with pytest.raises(UnsafePathError) as err:
        check_ancestors("/tmp/a/b/state", ME, fake(tree))
    assert f": {bad} " in str(err.value) and "/tmp/a/b/state" in str(err.value)


def test_sticky_shared_and_root_owned_ancestors_pass() -> None:
    tree = {**SAFE_TOP, "/tmp/a": st(DIR, 0o700, ME), "/home": st(DIR, 0o755, ROOT)}
    check_ancestors("/tmp/a/state", ME, fake(tree))
    check_ancestors("/home/me/.local/state/deepboot/default", ME, fake(tree))


@pytest.mark.parametrize(
    ("entry", "secret", "words"),
    [
        (st(REG, 0o600, OTHER), True, ["owned by", "uid 65534"]),
        (st(REG, 0o644, ME), True, ["0644", "not 0600"]),
        (st(REG, 0o400, ME), True, ["0400", "not 0600"]),
        (st(LNK, 0o777, ME), True, ["symlink"]),
        (st(DIR, 0o700, ME), True, ["not a regular file"]),
        (st(REG, 0o666, ME), False, ["writable by other users"]),
        (st(REG, 0o644, OTHER), False, ["owned by"]),
    ],
)
def test_a_file_we_did_not_create_is_refused(
    entry: os.stat_result, secret: bool, words: list[str]
) -> None:
    with pytest.raises(UnsafePathError) as err:
        check_own_file("/s/http-token", ME, fake({"/s/http-token": entry}), secret=secret)
    assert "/s/http-token" in str(err.value) and "\n" not in str(err.value)
    for word in words:
        assert word in str(err.value)


def test_files_of_ours_pass() -> None:
    tree = {"/s/t": st(REG, 0o600, ME), "/s/db": st(REG, 0o644, ME)}
    assert check_own_file("/s/t", ME, fake(tree), secret=True)
    assert check_own_file("/s/db", ME, fake(tree))
    assert not check_own_file("/s/none", ME, fake(tree), secret=True)


# -- on real files, as this user -------------------------------------------------------


def test_ensure_creates_0700_and_tokens_0600_and_a_restart_reuses_them(tmp_path: Path) -> None:
    state = StateDir.at(tmp_path / "a" / "b" / "state")
    token = state.ensure_http_token()
    assert stat.S_IMODE(state.root.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    for path in (token, state.http_header):
        assert stat.S_IMODE(path.lstat().st_mode) == 0o600
    first = state.read_http_token()
    assert len(first) == 64
    # Recovery after a crash: the directory is ours, the tokens exist: the same token.
    again = StateDir.at(state.root)
    again.ensure_http_token()
    assert again.read_http_token() == first
    assert again.ensure_token() == again.ensure_token()


def test_a_token_file_made_loose_is_refused_by_every_reader(tmp_path: Path) -> None:
    state = StateDir.at(tmp_path / "s")
    state.ensure_http_token()
    os.chmod(state.http_token, 0o644)
    with pytest.raises(UnsafePathError, match="0644"):
        StateDir.at(state.root)
    with pytest.raises(UnsafePathError, match="0644"):
        read_secret(state.http_token)


def test_a_secret_swapped_for_a_symlink_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("x" * 64)
    os.chmod(target, 0o600)
    link = tmp_path / "token"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError, match="symlink"):
        read_secret(link)


def test_the_default_is_outside_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert xdg_root({"XDG_STATE_HOME": "/x/state"}) == Path("/x/state/deepboot/default")
    # A relative XDG_STATE_HOME is ignored, as the XDG spec says.
    assert xdg_root({"XDG_STATE_HOME": "rel", "HOME": "/h"}).is_absolute()
    assert default_root({"XDG_STATE_HOME": "/x"}) == (Path("/x/deepboot/default"), False)
    # A ./.deepboot whose cluster runs (older versions' default) is used, and said.
    legacy = tmp_path / ".deepboot"
    legacy.mkdir(mode=0o700)
    assert default_root({"XDG_STATE_HOME": "/x"})[0] == Path("/x/deepboot/default")
    (legacy / "cluster.json").write_text("{}")
    assert default_root({"XDG_STATE_HOME": "/x"}) == (legacy, True)


def test_a_legacy_state_dir_in_use_is_named_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from deepboot.cli.main import main
    from deepboot.runtime.store.jobstore import JobStore

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    legacy = StateDir.at(tmp_path / ".deepboot").ensure()
    JobStore(legacy.db).close()
    record = {"mode": "local", "address": "127.0.0.1:1", "temp_dir": str(tmp_path / "ray"),
              "nodes": [], "token_file": ""}  # fmt: skip
    legacy.cluster_file.write_text(json.dumps(record))
    assert main(["status", "--json"]) == 0
    err = capsys.readouterr().err
    assert "./.deepboot" in err and "--state-dir" in err


def test_git_work_trees(tmp_path: Path) -> None:
    import subprocess

    tree = tmp_path / "tree"
    subprocess.run(["git", "init", "-q", str(tree)], check=True, timeout=30)
    with pytest.raises(UnsafePathError, match="does not ignore"):
        check_not_committable(tree / "st")
    (tree / ".gitignore").write_text("st/\n")
    check_not_committable(tree / "st")
    check_not_committable(tmp_path / "outside")
